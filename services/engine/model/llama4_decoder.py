"""Llama 4's decoder: the shared decoder (:class:`DecoderModel`) with Llama 4's attention and experts, computed as
transformers' ``Llama4TextAttention`` and ``Llama4TextMoe`` compute them (:mod:`services.engine.model.llama4`).

Attention: rope on the rotated layers (in float32, rounded once), then their q and k L2-normed per head
(``x * rsqrt(mean(x^2) + eps)`` in float32, no weight); the unrotated layers' queries times their float32
temperature, rounded once. Experts: each token's top-k router logits; the sigmoid of each (rounded to the serving
dtype) scales the token that expert takes, whose output is added unweighted, beside the shared expert's output. The
experts run one by one (a host read per sparse layer: no decode graphs)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from kernels.fused_ops import TorchRope
from kernels.linear import RowPaths, linear
from services.engine.model.decoder import DecoderModel, LayerWeights, attention_options

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.model.moe import MoEWeights


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
        # transformers rotates in float32 and rounds once: torch's rope here takes float32 tables (FlashInfer's
        # fused kernel computes in float32 itself)
        self._float32_rope = isinstance(self.ops.rope, TorchRope) and dtype != torch.float32
        if self._float32_rope:
            self.ops = replace(self.ops, rope=TorchRope(self.rope, torch.float32))

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
            if self._float32_rope:
                rq, rk = self.ops.rope(q.float(), k.float(), rope)
                q, k = rq.to(q.dtype), rk.to(k.dtype)
            else:
                q, k = self.ops.rope(q, k, rope)
            if spec.qk_l2_norm:
                q, k = l2_norm(q, cfg.rms_norm_eps), l2_norm(k, cfg.rms_norm_eps)
        elif query_scale is not None:
            q = (q * query_scale).to(q.dtype)
        v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        attn = attention.forward(q, k, v, kv_cache, self.scale, **attention_options(cfg, i))
        return linear(attn.reshape(num_tokens, cfg.q_size), layer.o, paths)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights, paths: RowPaths | None) -> torch.Tensor:
        if layer.moe is None:
            return super()._mlp(x, layer, paths)
        return self._shared_out(x, layer.moe) + self._routed_out(x, layer.moe)

    def _shared_out(self, x: torch.Tensor, moe: MoEWeights) -> torch.Tensor:
        shared = moe.shared
        assert shared is not None
        return linear(self.ops.silu_and_mul(linear(x, shared.gate_up)), shared.down)

    def _routed_out(self, x: torch.Tensor, moe: MoEWeights) -> torch.Tensor:
        """Each token through its top-k experts, its input scaled by each one's sigmoid score (see the module)."""
        spec = self.config.moe
        assert spec is not None
        top_logits, top_experts = linear(x, moe.router).topk(spec.top_k, dim=-1)
        scores = torch.sigmoid(top_logits.float()).to(x.dtype).flatten()
        flat = top_experts.flatten()
        order = flat.argsort(stable=True)
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(torch.bincount(flat, minlength=spec.num_experts).tolist()):
            if not count:
                continue
            slots = order[start:start + count]
            start += count
            tokens = slots // spec.top_k
            rows = x[tokens] * scores[slots, None]
            out.index_add_(0, tokens, linear(self.ops.silu_and_mul(linear(rows, moe.gate_up[expert])),
                                             moe.down[expert]))
        return out
