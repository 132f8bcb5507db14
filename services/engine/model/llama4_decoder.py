"""Llama 4's decoder: the shared decoder (:class:`DecoderModel`) with Llama 4's attention and experts, computed as
transformers' ``Llama4TextAttention`` and ``Llama4TextMoe`` compute them (:mod:`services.engine.model.llama4`).

Attention: rope on the rotated layers (in float32, rounded once), then their q and k L2-normed per head
(``x * rsqrt(mean(x^2) + eps)`` in float32, no weight); the unrotated layers' queries times their float32
temperature, rounded once. Experts: the shared decoder's (``moe_forward``), as ``MoEConfig`` says Llama 4's
route (the sigmoid of each top-k router logit) and weigh (the weight scales the token an expert takes, beside an
ungated shared expert); one by one (``weights_scale_inputs`` has no grouped-GEMM path: no decode graphs)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from kernels.fused_ops import Float32Rope, TorchRope
from kernels.linear import RowPaths, linear
from services.engine.model.decoder import DecoderModel, LayerWeights, attention_options

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``Llama4TextL2Norm``: each row over its last dim, in float32, returned in ``x.dtype``."""
    y = x.float()
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Llama4DecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a Llama 4 checkpoint (``config.llama4`` set); same constructor. Its experts are
    never grouped (their inputs are scaled per expert)."""

    def __init__(self, config, tensors, dtype, *args, **kwargs):
        assert config.llama4 is not None, "Llama4DecoderModel needs a Llama 4 config"
        kwargs["grouped_experts"] = False
        super().__init__(config, tensors, dtype, *args, **kwargs)
        # transformers rotates in float32 and rounds once: torch's rope here too (FlashInfer's fused kernel computes
        # in float32 itself)
        if type(self.ops.rope) is TorchRope and dtype != torch.float32:
            self.ops = replace(self.ops, rope=Float32Rope(self.rope))

    def _query_scale(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """The unrotated layers' float32 temperature ``[T, 1, 1]`` (None without one)."""
        spec = self.config.llama4
        assert spec is not None
        if not spec.temperature_scale:
            return None
        periods = torch.floor((positions.float() + 1.0) / spec.temperature_floor)
        return (torch.log1p(periods) * spec.temperature_scale + 1.0)[:, None, None]

    def _attention(self, i: int, layer: LayerWeights, x: torch.Tensor, kv_cache: torch.Tensor,
                   attention: AttentionBackend, rope: object, paths: RowPaths | None,
                   query_scale: torch.Tensor | None = None) -> torch.Tensor:
        cfg, num_tokens, spec = self.config, x.shape[0], self.config.llama4
        assert spec is not None
        q, k, v = linear(x, layer.qkv, paths).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(num_tokens, cfg.num_heads, cfg.head_dim)
        k = k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        if i not in cfg.nope_layers:
            q, k = self.ops.rope(q, k, rope)
            if spec.qk_l2_norm:
                q, k = l2_norm(q, cfg.rms_norm_eps), l2_norm(k, cfg.rms_norm_eps)
        elif query_scale is not None:
            q = (q * query_scale).to(q.dtype)
        v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        attn = attention.forward(q, k, v, kv_cache, self.scale, **attention_options(cfg, i))
        return linear(attn.reshape(num_tokens, cfg.q_size), layer.o, paths)
