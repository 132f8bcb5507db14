"""Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash) over the shared decoder's paged KV cache.

Each token caches one row: its rope key, then its normed latent (``[k_rope | latent]``, ``qk_rope_head_dim +
kv_lora_rank`` wide, one KV head). The keys and values of the heads are never formed: ``kv_b_proj`` splits into
``W_UK`` (latent → each head's key part) and ``W_UV`` (latent → each head's value), and attention runs in the latent
space ("absorbed", as DeepSeek's inference code and vLLM's decode do)::

    q_h = [q_rope_h | q_nope_h @ W_UK_h]        score = q_h · [k_rope | latent] * scale
    out_h = (Σ p · [k_rope | latent])[rope:] @ W_UV_hᵀ

which is transformers' expanded computation re-associated: the same scores and outputs up to rounding. Every
backend serves it as multi-query attention of head dim ``rope + kv_lora_rank`` whose value is the key itself (the
output's rope part is dropped), and the shared rope rotates the leading ``qk_rope_head_dim`` dims of q and k.

What it costs: the cache's V half holds the same row again, twice an MLA-native layout (FlashInfer's MLA kernels
read one) but a fraction of the expanded heads' (DeepSeek-V3: 2 × 576 values a token-layer against 128 × 320). No
fused kernel takes a head dim of 576 here: FlashInfer's paged kernels (64/128/256) and the CPU decode kernel (512)
fall back to the torch backend for it, on a GPU too (its CUDA graphs included), until FlashInfer's MLA kernels are
wired in.
The deterministic mode does not serve it (its kernels' head dim is at most 512; the absorbed products are not
row-blocked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels.linear import LinearWeight, RowPaths, linear
from kernels.norm import rms_norm
from services.engine.errors import ModelLoadError
from services.engine.model.config import LatentAttention
from services.engine.model.decoder import DecoderModel, LayerWeights

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend

LATENT_NORM_EPS = 1e-6
"""The eps of ``q_a_layernorm`` and ``kv_a_layernorm``: transformers builds them with its RMSNorm's default, not the
config's ``rms_norm_eps`` (GLM-4.7-Flash's is 1e-5)."""


@dataclass
class LatentProjections:
    down: LinearWeight  # x → [q_a | kv_a] (with q_lora_rank) or [q | kv_a]
    q_a_norm: torch.Tensor | None  # [q_lora_rank]
    q_b: LinearWeight | None  # [heads * qk_head_dim, q_lora_rank]
    kv_a_norm: torch.Tensor  # [kv_lora_rank]
    w_uk: torch.Tensor  # [heads, qk_nope_head_dim, kv_lora_rank]
    w_uv: torch.Tensor  # [heads, kv_lora_rank, v_head_dim]


@dataclass
class LatentLayerWeights(LayerWeights):
    latent: LatentProjections | None = None


class LatentAttentionDecoderModel(DecoderModel):
    """A :class:`DecoderModel` whose layers attend through :class:`LatentProjections` (see the module)."""

    QUERY_TEMPERATURE = True

    def __init__(self, config, tensors, dtype, device="cpu", *args, deterministic: bool = False, **kwargs):
        if deterministic:
            raise ModelLoadError(f"the deterministic mode does not serve latent attention ({config.architecture})")
        super().__init__(config, tensors, dtype, device, *args, deterministic=deterministic, **kwargs)

    @property
    def _mla(self) -> LatentAttention:
        assert self.config.mla is not None
        return self.config.mla

    def _layer(self, i: int) -> LayerWeights:
        cfg, mla, take = self.config, self._mla, self._source.take
        p = f"model.layers.{i}."
        a, hidden, heads = p + "self_attn.", cfg.hidden_size, cfg.num_heads
        kv_a = (a + "kv_a_proj_with_mqa.weight", (mla.kv_lora_rank + mla.qk_rope_head_dim, hidden))
        q_a_norm = q_b = None
        if mla.q_lora_rank is None:
            q_part = (a + "q_proj.weight", (heads * mla.qk_head_dim, hidden))
        else:
            q_part = (a + "q_a_proj.weight", (mla.q_lora_rank, hidden))
            q_a_norm = take(a + "q_a_layernorm.weight", (mla.q_lora_rank,))
            q_b = self._projection([(a + "q_b_proj.weight", (heads * mla.qk_head_dim, mla.q_lora_rank))])
        kv_b = take(a + "kv_b_proj.weight", (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank))
        kv_b = kv_b.view(heads, mla.qk_nope_head_dim + mla.v_head_dim, mla.kv_lora_rank)
        latent = LatentProjections(
            down=self._projection([q_part, kv_a]), q_a_norm=q_a_norm, q_b=q_b,
            kv_a_norm=take(a + "kv_a_layernorm.weight", (mla.kv_lora_rank,)),
            w_uk=kv_b[:, :mla.qk_nope_head_dim].contiguous(),
            w_uv=kv_b[:, mla.qk_nope_head_dim:].transpose(1, 2).contiguous())
        layer = LatentLayerWeights(
            input_norm=take(p + "input_layernorm.weight", (hidden,)), qkv=None,  # type: ignore[arg-type]
            o=self._projection([(a + "o_proj.weight", (hidden, heads * mla.v_head_dim))]),
            post_norm=take(p + "post_attention_layernorm.weight", (hidden,)), gate_up=None, down=None,
            latent=latent)
        if cfg.attention_head_gate:  # Ling 3's: a sigmoid gate per head on the values
            layer.output_gate = self._projection([(a + "g_proj.weight", (heads, hidden))])
        return self._with_mlp(layer, i)

    def _attention(self, i: int, layer: LayerWeights, x: torch.Tensor, kv_cache: torch.Tensor,
                   attention: AttentionBackend, rope: object, paths: RowPaths | None,
                   query_scale: torch.Tensor | None = None) -> torch.Tensor:
        assert isinstance(layer, LatentLayerWeights) and layer.latent is not None
        q, k, _ = self._latent_qk(layer.latent, x, paths)
        if i not in self.config.nope_layers:  # Kimi Linear's attend unrotated
            q, k = self.ops.rope(q, k, rope)
        if query_scale is not None:  # Mistral 4's temperature: the whole query, as transformers scales it
            q = q * query_scale
        gate = None if layer.output_gate is None else linear(x, layer.output_gate, paths)
        return self._latent_out(layer, attention.forward(q, k, k, kv_cache, self.scale), paths, gate)

    def _latent_qk(self, w: LatentProjections, x: torch.Tensor, paths: RowPaths | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The absorbed query ``[T, H, rope + rank]`` and the cached row ``[T, 1, rope + rank]`` of ``x``, not yet
        rotated, and the normed q bottleneck (None without one)."""
        mla, tokens, heads = self._mla, x.shape[0], self.config.num_heads
        rope_dim, rank, nope = mla.qk_rope_head_dim, mla.kv_lora_rank, mla.qk_nope_head_dim
        down = linear(x, w.down, paths)
        q_resid = None
        if w.q_b is None:
            q, kv = down.split([heads * mla.qk_head_dim, rank + rope_dim], dim=-1)
        else:
            q_a, kv = down.split([mla.q_lora_rank, rank + rope_dim], dim=-1)  # type: ignore[list-item]
            q_resid = rms_norm(q_a, w.q_a_norm, LATENT_NORM_EPS)
            q = linear(q_resid, w.q_b, paths)
        q = q.view(tokens, heads, mla.qk_head_dim)
        latent, k_rope = kv.split([rank, rope_dim], dim=-1)
        q_latent = torch.bmm(q[..., :nope].transpose(0, 1), w.w_uk).transpose(0, 1)  # [T, H, rank]
        q = torch.cat((q[..., nope:], q_latent), dim=-1)
        k = torch.cat((k_rope, rms_norm(latent, w.kv_a_norm, LATENT_NORM_EPS)), dim=-1).view(tokens, 1, rope_dim + rank)
        return q, k, q_resid

    def _latent_out(self, layer: LayerWeights, out: torch.Tensor, paths: RowPaths | None,
                    head_gate: torch.Tensor | None = None) -> torch.Tensor:
        """The attention's output in the latent space (``out`` ``[T, H, row]``: its rope part, and anything after the
        latent, dropped) through ``W_UV`` (each head's values times ``sigmoid(head_gate)`` ``[T, H]`` where given) and
        the output projection."""
        assert isinstance(layer, LatentLayerWeights) and layer.latent is not None
        mla, tokens, heads = self._mla, out.shape[0], self.config.num_heads
        latent = out[..., mla.qk_rope_head_dim:mla.qk_rope_head_dim + mla.kv_lora_rank]
        values = torch.bmm(latent.transpose(0, 1), layer.latent.w_uv).transpose(0, 1)  # [T, H, v_head_dim]
        if head_gate is not None:
            values = values * torch.sigmoid(head_gate.float()).to(values.dtype)[..., None]
        return linear(values.reshape(tokens, heads * mla.v_head_dim), layer.o, paths)
