"""The decoder of AI21 Jamba (:mod:`services.engine.model.jamba`): Mamba (Mamba-1) layers (a selective scan with a
recurrent state per sequence, no KV; ``ModelConfig.mamba1``) between attention layers without rope, each followed by
a dense MLP or experts. Per layer: ``h += mix(norm(h))``, then ``h += mlp(norm(h))`` (plain RMSNorms).

A Mamba layer projects the x rows and the gate ``z``; x goes through a causal depthwise convolution (with bias) and
SiLU, then ``x_proj`` gives the step-size rows (rank ``dt_rank``) and B and C, each RMS-normed (Jamba's
``dt_layernorm``, ``b_layernorm``, ``c_layernorm``); ``dt = softplus(dt_proj(dt rows) + bias)``; the scan
(:mod:`kernels.selective_scan`, ``A = -exp(A_log)`` per channel and state dim) plus ``D · x``, times ``silu(z)``,
through ``out_proj``. The states live in the :class:`~services.engine.recurrent_states.RecurrentStates` the model
runner passes to :meth:`JambaDecoderModel.final_hidden`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.gated_delta import causal_conv1d
from kernels.linear import LinearWeight, RowPaths, linear
from kernels.norm import rms_norm
from kernels.selective_scan import selective_scan
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, LayerWeights
from services.engine.model.pre_norm_hybrid import PreNormHybrid

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class Mamba1Weights:
    in_proj: LinearWeight  # [2 * inner, hidden]: x rows, then z rows
    conv: torch.Tensor  # [inner, conv_kernel]
    conv_bias: torch.Tensor | None  # [inner]
    x_proj: LinearWeight  # [dt_rank + 2 * state_size, inner]: step-size rows, B, C
    dt_proj: LinearWeight  # [inner, dt_rank], no bias
    dt_bias: torch.Tensor  # [inner]
    a: torch.Tensor  # [inner, state_size] float32: -exp(A_log)
    skip: torch.Tensor  # [inner] float32: D
    dt_norm: torch.Tensor | None  # [dt_rank]; None: no inner norms, or weightless ones (Mamba1.inner_norms)
    b_norm: torch.Tensor | None  # [state_size]
    c_norm: torch.Tensor | None  # [state_size]
    out_proj: LinearWeight


@dataclass
class JambaLayerWeights(LayerWeights):
    mamba: Mamba1Weights | None = None  # a Mamba layer's (its qkv and o are unused then)


class JambaDecoderModel(PreNormHybrid, DecoderModel):
    """A :class:`DecoderModel` over a Jamba checkpoint; same constructor. Not served in the deterministic mode."""

    FUSED_OPS = False

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        if config.mamba1 is not None and kwargs.get("deterministic"):
            raise ModelLoadError(f"{config.architecture} is not served in the deterministic mode (its Mamba layers "
                                 "have no batch-invariant kernel here)")
        super().__init__(config, tensors, dtype, *args, **kwargs)

    def _layer(self, i: int) -> JambaLayerWeights:
        spec = self.config.mamba1
        if spec is None or i not in spec.layers:
            base = super()._layer(i)
            return JambaLayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
        take, hidden, p = self._source.take, self.config.hidden_size, f"model.layers.{i}."
        net = self._mamba1_weights(p + "mamba.")
        layer = JambaLayerWeights(input_norm=take(p + "input_layernorm.weight", (hidden,)), qkv=net.in_proj,
                                  o=net.out_proj, post_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
                                  gate_up=None, down=None, mamba=net)
        return self._with_mlp(layer, i)  # type: ignore[return-value]

    def _mamba1_weights(self, m: str) -> Mamba1Weights:
        """A Mamba layer's mixer weights, named ``m`` + ``in_proj.weight`` and so on."""
        spec, take, hidden = self.config.mamba1, self._source.take, self.config.hidden_size
        assert spec is not None
        rank, size, weighted = spec.dt_rank, spec.state_size, spec.inner_norms and spec.inner_norm_weights
        return Mamba1Weights(
            in_proj=self._projection([(m + "in_proj.weight", (2 * spec.inner, hidden))]),
            conv=take(m + "conv1d.weight", (spec.inner, 1, spec.conv_kernel))[:, 0],
            conv_bias=take(m + "conv1d.bias", (spec.inner,)) if spec.conv_bias else None,
            x_proj=self._projection([(m + "x_proj.weight", (rank + 2 * size, spec.inner))]),
            dt_proj=self._projection([(m + "dt_proj.weight", (spec.inner, rank))]),
            dt_bias=take(m + "dt_proj.bias", (spec.inner,)),
            a=-take(m + "A_log", (spec.inner, size), torch.float32).exp(),
            skip=take(m + "D", (spec.inner,), torch.float32),
            dt_norm=take(m + "dt_layernorm.weight", (rank,)) if weighted else None,
            b_norm=take(m + "b_layernorm.weight", (size,)) if weighted else None,
            c_norm=take(m + "c_layernorm.weight", (size,)) if weighted else None,
            out_proj=self._projection([(m + "out_proj.weight", (hidden, spec.inner))]),
        )

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention layers' only), computed as
        the module says; ``states`` planned for this step."""
        return self._pre_norm_hidden(input_ids, positions, kv_caches, attention, logits_indices, paths,
                                     lambda i, layer, x: None if layer.mamba is None
                                     else self._mamba(i, layer.mamba, x, paths, states))

    def _mamba(self, i: int, net: Mamba1Weights, x: torch.Tensor, paths: RowPaths | None,
               states: RecurrentStates | None) -> torch.Tensor:
        spec = self.config.mamba1
        assert spec is not None and states is not None, "a hybrid model runs with its recurrent states"
        eps = self.config.rms_norm_eps if spec.inner_norm_eps is None else spec.inner_norm_eps
        n, plan = spec.layers.index(i), states.plan
        xs, gate = linear(x, net.in_proj, paths).chunk(2, dim=-1)
        xs = causal_conv1d(xs.contiguous(), net.conv, states.conv[n], plan.slots, plan.query_lens, plan.fresh,
                           net.conv_bias, plan.saves)
        steps, b, c = linear(xs, net.x_proj, paths).split([spec.dt_rank, spec.state_size, spec.state_size], dim=-1)
        if spec.inner_norms:  # Falcon-Mamba's are weightless (None)
            steps, b, c = rms_norm(steps, net.dt_norm, eps), rms_norm(b, net.b_norm, eps), rms_norm(c, net.c_norm, eps)
        dt = F.softplus(linear(steps, net.dt_proj, paths) + net.dt_bias).float()  # in the model dtype, as transformers
        y = selective_scan(xs, dt, net.a, b, c, states.ssm[n], plan.slots, plan.query_lens, plan.fresh, plan.saves)
        y = (y + net.skip * xs.float()) * F.silu(gate.float())
        return linear(y.to(x.dtype), net.out_proj, paths)

