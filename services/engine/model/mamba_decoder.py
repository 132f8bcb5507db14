"""The decoder of IBM Granite 4.0 (``granitemoehybrid``) and Bamba: Mamba-2 layers (a selective state space with a
recurrent state per sequence, no KV; ``ModelConfig.mamba``) between Granite's attention layers, each followed by
Granite's MLP (experts beside a shared MLP, or the shared MLP alone; Bamba's dense MLP), with Granite's four scalars
(Bamba's all 1). Falcon-H1's decoder (:mod:`services.engine.model.falcon_h1_decoder`) builds on it.

Per layer: ``h += residual · mix(norm(h))``, then ``h += residual · mlp(norm(h))`` (plain RMSNorms). A Mamba-2 layer
projects the gate ``z``, the x/B/C rows (through a causal depthwise convolution with bias and SiLU) and the step
sizes ``dt`` (``softplus(dt + dt_bias)``), runs the scan (:mod:`kernels.ssd`, ``A = -exp(A_log)``) plus the
``D · x`` skip, multiplies by ``silu(z)`` and RMS-norms each of its ``groups`` groups (the gate before the norm).
The states live in the :class:`~services.engine.recurrent_states.RecurrentStates` the model runner passes to
:meth:`MambaDecoderModel.final_hidden`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.gated_delta import causal_conv1d
from kernels.linear import LinearWeight, RowPaths, linear
from kernels.norm import rms_norm
from kernels.ssd import ssd_scan
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, LayerWeights

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class MambaWeights:
    in_proj: LinearWeight  # [intermediate + conv_dim + heads, hidden]: z, x/B/C, dt rows
    conv: torch.Tensor  # [conv_dim, conv_kernel]
    conv_bias: torch.Tensor | None  # [conv_dim]
    dt_bias: torch.Tensor  # [heads]
    a: torch.Tensor  # [heads] float32: -exp(A_log)
    skip: torch.Tensor  # [heads] float32: D
    norm: torch.Tensor | None  # [intermediate]; None: no norm (Falcon-H1's without ``mamba_rms_norm``)
    out_proj: LinearWeight


@dataclass
class MambaLayerWeights(LayerWeights):
    mamba: MambaWeights | None = None  # a Mamba-2 layer's (its qkv and o are unused then)


class MambaDecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a Granite 4.0 or Bamba checkpoint; same constructor. Not served in the
    deterministic mode when it has Mamba-2 layers."""

    FUSED_OPS = False

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        if config.mamba is not None and kwargs.get("deterministic"):
            raise ModelLoadError(f"{config.architecture} is not served in the deterministic mode (its Mamba-2 layers "
                                 "have no batch-invariant kernel here)")
        if config.moe is None:  # the shared MLP alone is the dense MLP
            tensors = {name.replace(".mlp.shared_expert.", ".mlp."): t for name, t in tensors.items()}
        super().__init__(config, tensors, dtype, *args, **kwargs)

    def _layer(self, i: int) -> MambaLayerWeights:
        spec = self.config.mamba
        if spec is None or i not in spec.layers:
            base = super()._layer(i)
            return MambaLayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
        take, hidden = self._source.take, self.config.hidden_size
        mamba = self._mamba_weights(f"model.layers.{i}.mamba.")
        p = f"model.layers.{i}."
        layer = MambaLayerWeights(input_norm=take(p + "input_layernorm.weight", (hidden,)), qkv=mamba.in_proj,
                                  o=mamba.out_proj, post_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
                                  gate_up=None, down=None, mamba=mamba)
        return self._with_mlp(layer, i)  # type: ignore[return-value]

    def _mamba_weights(self, m: str, norm: bool = True) -> MambaWeights:
        """A Mamba-2 mixer's weights, named ``m`` + ``in_proj.weight`` and so on (``norm``: it has its grouped
        norm)."""
        spec, take, hidden = self.config.mamba, self._source.take, self.config.hidden_size
        assert spec is not None
        return MambaWeights(
            in_proj=self._projection([(m + "in_proj.weight", (spec.intermediate + spec.conv_dim + spec.heads,
                                                              hidden))]),
            conv=take(m + "conv1d.weight", (spec.conv_dim, 1, spec.conv_kernel))[:, 0],
            conv_bias=take(m + "conv1d.bias", (spec.conv_dim,)) if spec.conv_bias else None,
            dt_bias=take(m + "dt_bias", (spec.heads,)),
            a=-take(m + "A_log", (spec.heads,), torch.float32).exp(),
            skip=take(m + "D", (spec.heads,), torch.float32),
            norm=take(m + "norm.weight", (spec.intermediate,)) if norm else None,
            out_proj=self._projection([(m + "out_proj.weight", (hidden, spec.intermediate))]),
        )

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention layers' only), computed as
        the module says; ``states`` planned for this step."""
        cfg, eps = self.config, self.config.rms_norm_eps
        scalars = cfg.multipliers
        assert scalars is not None, "Granite's scalars"
        hidden = F.embedding(input_ids, self.embed) * scalars.embedding
        rope = self.ops.rope.prepare(positions)
        for i, layer in enumerate(self.layers):
            x = rms_norm(hidden, layer.input_norm, eps)
            if layer.mamba is not None:
                mixed = self._mamba(i, layer.mamba, x, paths, states)
            else:
                mixed = self._attention(i, layer, x, kv_caches[self._kv_index[i]], attention, rope, paths)
            hidden = hidden + mixed * scalars.residual
            hidden = hidden + self._mlp(rms_norm(hidden, layer.post_norm, eps), layer, paths) * scalars.residual
        return rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

    def _mamba(self, i: int, net: MambaWeights, x: torch.Tensor, paths: RowPaths | None,
               states: RecurrentStates | None) -> torch.Tensor:
        y, gate = self._ssd(i, net, linear(x, net.in_proj, paths), states)
        return linear(gated_group_norm(y, gate, net.norm, self.config, norm_before_gate=False).to(x.dtype),
                      net.out_proj, paths)

    def _ssd(self, i: int, net: MambaWeights, projected: torch.Tensor,
             states: RecurrentStates | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s mixer from its input projection ``projected`` (z, x/B/C, dt rows) to the scan's output plus
        ``D · x`` (float32 ``[T, intermediate]``) and its gate ``z``."""
        spec = self.config.mamba
        assert spec is not None and states is not None, "a hybrid model runs with its recurrent states"
        n, plan, num_tokens = spec.layers.index(i), states.plan, projected.shape[0]
        gate, xbc, dt = projected.split([spec.intermediate, spec.conv_dim, spec.heads], dim=-1)
        xbc = causal_conv1d(xbc, net.conv, states.conv[n], plan.slots, plan.query_lens, plan.fresh, net.conv_bias,
                            plan.saves)
        xs, b, c = xbc.split([spec.intermediate, spec.groups * spec.state_size, spec.groups * spec.state_size], dim=-1)
        xs = xs.reshape(num_tokens, spec.heads, spec.head_dim)
        dt = F.softplus(dt + net.dt_bias)
        if spec.dt_min > 0:  # time_step_limit's floor
            dt = dt.clamp(min=spec.dt_min)
        y = ssd_scan(xs, dt, net.a, b.reshape(num_tokens, spec.groups, spec.state_size),
                     c.reshape(num_tokens, spec.groups, spec.state_size), states.ssm[n], plan.slots, plan.query_lens,
                     plan.fresh, plan.saves)
        return (y + net.skip[:, None] * xs.float()).reshape(num_tokens, spec.intermediate), gate


def gated_group_norm(y: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None, config: ModelConfig,
                     norm_before_gate: bool) -> torch.Tensor:
    """A Mamba-2 mixer's output ``y`` (float32 ``[T, intermediate]``) gated by ``silu(gate)`` and RMS-normed over
    each of its groups times ``weight``: the gate first (Granite's, Bamba's, Nemotron-H's), or the norm first
    (``norm_before_gate``); ``weight`` None: the gate alone. Float32."""
    spec = config.mamba
    assert spec is not None
    silu = F.silu(gate.float())
    if weight is None:
        return y * silu
    x = y if norm_before_gate else y * silu
    grouped = x.view(x.shape[0], spec.groups, spec.intermediate // spec.groups)
    normed = weight * F.rms_norm(grouped, (grouped.shape[-1],), None, config.rms_norm_eps).view_as(x)
    return normed * silu if norm_before_gate else normed
