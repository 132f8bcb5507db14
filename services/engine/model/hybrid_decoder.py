"""The hybrid decoder of Qwen3.5 and Qwen3-Next: Gated DeltaNet layers (a recurrent state per sequence, no KV)
between full-attention layers (``ModelConfig.linear_attention``), each followed by the shared decoder's MLP
(dense, or sparse experts with a gated shared expert).

Per layer: ``h += mix(norm(h))``, then ``h += mlp(norm(h))``, every norm but the DeltaNet's own computed in float32
and scaled by ``1 + weight`` (Gemma's). A full-attention layer is Qwen3's (per-head q/k norms, rope on the first
``rotary_dim`` dims of a head) with its output multiplied by ``sigmoid(gate)``, the gate rows coming from the
same projection as q. A DeltaNet layer projects q/k/v (through a causal depthwise convolution and SiLU), an
output gate ``z``, a write strength ``beta = sigmoid(b)`` and a decay ``g = -exp(A_log) * softplus(a + dt_bias)``,
runs the gated delta rule (:mod:`kernels.gated_delta`) and norms each head's output gated by ``silu(z)``.

The states live in a :class:`~services.engine.recurrent_states.RecurrentStates` the model runner holds, plans before
each step and passes to :meth:`final_hidden`. Elementwise steps run torch's ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.gated_delta import causal_conv1d, gated_delta_rule
from kernels.linear import LinearWeight, RowPaths, linear
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, LayerWeights, attention_options
from services.engine.model.gemma_decoder import gemma_rms_norm, offset_norm_weight

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class DeltaNetWeights:
    in_proj: LinearWeight  # [conv_dim + value_dim + 2 * value_heads, hidden]: q, k, v, z, b, a rows
    conv: torch.Tensor  # [conv_dim, conv_kernel]
    dt_bias: torch.Tensor  # [value_heads] float32
    a_scale: torch.Tensor  # [value_heads] float32: -exp(A_log)
    norm: torch.Tensor  # [value_head_dim]
    out_proj: LinearWeight


@dataclass
class HybridLayerWeights(LayerWeights):
    delta_net: DeltaNetWeights | None = None  # a linear-attention layer's (its qkv and o are unused then)


class HybridDecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a Qwen3.5 or Qwen3-Next checkpoint (``config.linear_attention`` set); same
    constructor. Not served in the deterministic mode."""

    FUSED_OPS = False

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        assert config.linear_attention is not None, "HybridDecoderModel needs linear-attention layers"
        if kwargs.get("deterministic"):
            raise ModelLoadError(f"{config.architecture} is not served in the deterministic mode (its linear-"
                                 "attention layers have no batch-invariant kernel here)")
        super().__init__(config, _split_tensors(config, tensors), dtype, *args, **kwargs)
        self.final_norm = offset_norm_weight(self.final_norm)

    def _qkv_parts(self, a: str) -> list[tuple[str, tuple[int, int]]]:
        """q, k and v rows, then the output gate's (split out of q_proj at load)."""
        cfg = self.config
        return [*super()._qkv_parts(a), (a + "o_gate.weight", (cfg.q_size, cfg.hidden_size))]

    def _layer(self, i: int) -> HybridLayerWeights:
        cfg, take, p = self.config, self._source.take, f"model.layers.{i}."
        linear_spec = cfg.linear_attention
        assert linear_spec is not None
        if i not in linear_spec.layers:
            base = super()._layer(i)
            layer = HybridLayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
            layer.q_norm, layer.k_norm = offset_norm_weight(layer.q_norm), offset_norm_weight(layer.k_norm)
        else:
            hidden, d = cfg.hidden_size, p + "linear_attn."
            s = linear_spec
            heads = s.value_heads
            net = DeltaNetWeights(
                in_proj=self._projection([(d + "in_proj_qkv.weight", (s.conv_dim, hidden)),
                                          (d + "in_proj_z.weight", (s.value_dim, hidden)),
                                          (d + "in_proj_b.weight", (heads, hidden)),
                                          (d + "in_proj_a.weight", (heads, hidden))]),
                conv=take(d + "conv1d.weight", (s.conv_dim, 1, s.conv_kernel))[:, 0],
                dt_bias=take(d + "dt_bias", (heads,)).float(),
                a_scale=-take(d + "A_log", (heads,), torch.float32).exp(),
                norm=take(d + "norm.weight", (s.value_head_dim,)),
                out_proj=self._projection([(d + "out_proj.weight", (hidden, s.value_dim))]),
            )
            layer = HybridLayerWeights(input_norm=take(p + "input_layernorm.weight", (hidden,)), qkv=net.in_proj,
                                       o=net.out_proj, post_norm=take(p + "post_attention_layernorm.weight",
                                                                      (hidden,)),
                                       gate_up=None, down=None, delta_net=net)
            layer = self._with_mlp(layer, i)  # type: ignore[assignment]
        layer.input_norm, layer.post_norm = offset_norm_weight(layer.input_norm), offset_norm_weight(layer.post_norm)
        return layer

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention layers' only), computed as
        the module says; ``states`` planned for this step."""
        eps = self.config.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed)
        rope = self.ops.rope.prepare(positions)
        for i, layer in enumerate(self.layers):
            x = gemma_rms_norm(hidden, layer.input_norm, eps)
            if layer.delta_net is not None:
                hidden = hidden + self._delta_net(i, layer.delta_net, x, paths, states)
            else:
                hidden = hidden + self._gated_attention(i, layer, x, kv_caches[self._kv_index[i]], attention, rope,
                                                        paths)
            hidden = hidden + self._mlp(gemma_rms_norm(hidden, layer.post_norm, eps), layer, paths)
        return gemma_rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

    def _gated_attention(self, i: int, layer: LayerWeights, x: torch.Tensor, kv_cache: torch.Tensor,
                         attention: AttentionBackend, rope: object, paths: RowPaths | None) -> torch.Tensor:
        cfg, eps, num_tokens = self.config, self.config.rms_norm_eps, x.shape[0]
        q, k, v, gate = linear(x, layer.qkv, paths).split([cfg.q_size, cfg.kv_size, cfg.kv_size, cfg.q_size], dim=-1)
        q = gemma_rms_norm(q.reshape(num_tokens, cfg.num_heads, cfg.head_dim), layer.q_norm, eps)
        k = gemma_rms_norm(k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim), layer.k_norm, eps)
        q, k = self.ops.rope(q, k, rope)
        v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        attn = attention.forward(q, k, v, kv_cache, self.scale, **attention_options(cfg, i))
        return linear(attn.reshape(num_tokens, cfg.q_size) * torch.sigmoid(gate), layer.o, paths)

    def _delta_net(self, i: int, net: DeltaNetWeights, x: torch.Tensor, paths: RowPaths | None,
                   states: RecurrentStates | None) -> torch.Tensor:
        return delta_net(self.config, i, net, x, paths, states)


def delta_net(config: ModelConfig, i: int, net: DeltaNetWeights, x: torch.Tensor, paths: RowPaths | None,
              states: RecurrentStates | None, beta_scale: float = 1.0, norm_eps: float | None = None) -> torch.Tensor:
    """Gated DeltaNet layer ``i`` on its normed input ``x`` (see the module), its output through ``out_proj``;
    ``beta_scale``: the write strength's (OLMo Hybrid's 2: eigenvalues down to -1); ``norm_eps``: the output norm's
    (None: the config's)."""
    spec = config.linear_attention
    assert spec is not None and states is not None, "a hybrid model runs with its recurrent states"
    n, plan, num_tokens = spec.layers.index(i), states.plan, x.shape[0]
    mixed, z, b, a = linear(x, net.in_proj, paths).split(
        [spec.conv_dim, spec.value_dim, spec.value_heads, spec.value_heads], dim=-1)
    mixed = causal_conv1d(mixed, net.conv, states.conv[n], plan.slots, plan.query_lens, plan.fresh, saves=plan.saves)
    q, k, v = mixed.split([spec.key_dim, spec.key_dim, spec.value_dim], dim=-1)
    decay = net.a_scale * F.softplus(a.float() + net.dt_bias)
    beta = b.sigmoid() if beta_scale == 1.0 else b.sigmoid() * beta_scale
    out = gated_delta_rule(q.reshape(num_tokens, spec.key_heads, spec.key_head_dim),
                           k.reshape(num_tokens, spec.key_heads, spec.key_head_dim),
                           v.reshape(num_tokens, spec.value_heads, spec.value_head_dim),
                           decay, beta, states.ssm[n], plan.slots, plan.query_lens, plan.fresh, plan.saves)
    eps = config.rms_norm_eps if norm_eps is None else norm_eps
    normed = F.rms_norm(out.float(), (spec.value_head_dim,), None, eps).to(out.dtype)
    gated = (net.norm * normed).float() * F.silu(z.reshape(out.shape).float())
    return linear(gated.to(out.dtype).reshape(num_tokens, spec.value_dim), net.out_proj, paths)


def _split_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as the model reads them: each attention layer's q_proj split into its q rows and
    its output gate's (``o_gate``); Qwen3-Next's fused DeltaNet projections (``in_proj_qkvz``, ``in_proj_ba``,
    grouped per key head) split into Qwen3.5's (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``)."""
    spec = config.linear_attention
    assert spec is not None
    out = dict(tensors)
    for i in config.kv_layers:
        name = f"model.layers.{i}.self_attn.q_proj.weight"
        if name in out:
            rows = out.pop(name)
            per_head = rows.reshape(config.num_heads, 2, config.head_dim, -1)
            out[name] = per_head[:, 0].reshape(config.q_size, -1)
            out[f"model.layers.{i}.self_attn.o_gate.weight"] = per_head[:, 1].reshape(config.q_size, -1)
    for i in spec.layers:
        d = f"model.layers.{i}.linear_attn."
        if d + "in_proj_qkvz.weight" in out:
            out.update(_unfused_qkvz(spec, out.pop(d + "in_proj_qkvz.weight"), out.pop(d + "in_proj_ba.weight"), d))
    return out


def _unfused_qkvz(spec: Any, qkvz: torch.Tensor, ba: torch.Tensor, d: str) -> dict[str, torch.Tensor]:
    """Qwen3-Next stores, per key head, its q, k, then its value heads' v and z rows (and per key head its value
    heads' b, then a rows)."""
    ratio, hidden = spec.value_heads // spec.key_heads, qkvz.shape[-1]
    dk, dv = spec.key_head_dim, spec.value_head_dim
    if qkvz.shape[0] != 2 * spec.key_dim + 2 * spec.value_dim or ba.shape[0] != 2 * spec.value_heads:
        raise ModelLoadError(f"{d}in_proj_qkvz/in_proj_ba have {qkvz.shape[0]}/{ba.shape[0]} rows, the config needs "
                             f"{2 * spec.key_dim + 2 * spec.value_dim}/{2 * spec.value_heads}")
    grouped = qkvz.reshape(spec.key_heads, 2 * dk + 2 * ratio * dv, hidden)
    q, k, v, z = grouped.split([dk, dk, ratio * dv, ratio * dv], dim=1)
    b, a = ba.reshape(spec.key_heads, 2 * ratio, hidden).split([ratio, ratio], dim=1)
    flat = [t.reshape(-1, hidden) for t in (q, k, v, z, b, a)]
    return {d + "in_proj_qkv.weight": torch.cat(flat[:3]), d + "in_proj_z.weight": flat[3],
            d + "in_proj_b.weight": flat[4], d + "in_proj_a.weight": flat[5]}
