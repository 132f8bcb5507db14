"""The decoder of Kimi Linear (:mod:`services.engine.model.kimi_linear`) and Ling 3
(:mod:`services.engine.model.bailing_hybrid`): Kimi Delta Attention layers (a recurrent state per sequence, no KV)
between latent-attention layers (:mod:`services.engine.model.mla_decoder`'s: Kimi's unrotated, Ling's rotated with a
gate per head), each followed by a dense MLP or experts. Per layer: ``h += mix(norm(h))``, then ``h += mlp(norm(h))``
(plain RMSNorms).

A KDA layer projects q, k and v apart (one product here, with the gates' first low-rank halves and ``b``: all read
the layer's normed input), runs them through a causal depthwise convolution (one kernel per q/k/v channel) and SiLU;
its decay per key dim is ``-exp(A_log) · softplus(f_b(f_a(x)) + dt_bias)`` (``A_log`` one per head), its write
strength ``sigmoid(b_proj(x))``; the rule (:mod:`kernels.kimi_delta`) l2-norms q and k. Each head's output is RMS-normed
in float32, times the norm's weight and ``sigmoid(g_b(g_a(x)))``, then ``o_proj``. The states live in the
:class:`~services.engine.recurrent_states.RecurrentStates` the model runner passes to :meth:`final_hidden`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.gated_delta import causal_conv1d
from kernels.kimi_delta import kimi_delta_rule
from kernels.linear import LinearWeight, RowPaths, linear
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.mla_decoder import LatentAttentionDecoderModel, LatentLayerWeights
from services.engine.model.pre_norm_hybrid import PreNormHybrid

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class KimiDeltaWeights:
    # [3 * width + 2 * rank + heads, hidden]: q, k, v, the forget gate's, the output gate's (rank head_dim: Kimi's
    # f_a and g_a; rank width: Ling 3's f_proj and g_proj, whole), b rows
    in_proj: LinearWeight
    conv: torch.Tensor  # [3 * width, conv_kernel] (float32 with LinearAttention.float32_mixer)
    f_b: LinearWeight | None  # [width, head_dim]; None: the gates are whole
    dt_bias: torch.Tensor  # [width] float32
    a_rate: torch.Tensor  # [heads, 1] float32: exp(A_log)
    g_b: LinearWeight | None  # [width, head_dim]
    norm: torch.Tensor  # [head_dim] float32
    out_proj: LinearWeight


@dataclass
class KimiLinearLayerWeights(LatentLayerWeights):
    kda: KimiDeltaWeights | None = None  # a KDA layer's (its latent projections are unused then)


class KimiLinearDecoderModel(PreNormHybrid, LatentAttentionDecoderModel):
    """A :class:`LatentAttentionDecoderModel` over a Kimi Linear checkpoint; same constructor."""

    FUSED_OPS = False

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        spec = config.linear_attention
        if spec is None or not spec.channel_decay:
            raise ModelLoadError(f"{config.architecture}: the Kimi Linear decoder needs Kimi Delta Attention layers")
        if kwargs.get("deterministic"):
            raise ModelLoadError(f"{config.architecture} is not served in the deterministic mode (its Kimi Delta "
                                 "Attention layers have no batch-invariant kernel here)")
        super().__init__(config, tensors, dtype, *args, **kwargs)

    def _layer(self, i: int) -> KimiLinearLayerWeights:
        spec = self.config.linear_attention
        assert spec is not None
        if i not in spec.layers:
            base = super()._layer(i)
            return KimiLinearLayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
        take, hidden, p = self._source.take, self.config.hidden_size, f"model.layers.{i}."
        a, heads, dk = p + "self_attn.", spec.key_heads, spec.key_head_dim
        width = heads * dk
        whole = spec.full_rank_gates
        gates = [(a + "f_proj.weight", (width, hidden)), (a + "g_proj.weight", (width, hidden))] if whole else \
            [(a + "f_a_proj.weight", (dk, hidden)), (a + "g_a_proj.weight", (dk, hidden))]
        a_log = self._source.tensors.get(a + "A_log")  # one per head: [heads] (Ling 3's) or [1, 1, heads, 1] (Kimi's)
        net = KimiDeltaWeights(
            in_proj=self._projection([*((a + f"{x}_proj.weight", (width, hidden)) for x in "qkv"), *gates,
                                      (a + "b_proj.weight", (heads, hidden))]),
            conv=self._conv(a, 3 * width, spec.conv_kernel, torch.float32 if spec.float32_mixer else None),
            f_b=None if whole else self._projection([(a + "f_b_proj.weight", (width, dk))]),
            dt_bias=take(a + "dt_bias", (width,), torch.float32),
            a_rate=take(a + "A_log", tuple(a_log.shape) if a_log is not None and a_log.numel() == heads
                        else (heads,), torch.float32 if spec.float32_mixer else None).float().view(heads, 1).exp(),
            g_b=None if whole else self._projection([(a + "g_b_proj.weight", (width, dk))]),
            norm=take(a + "o_norm.weight", (dk,), torch.float32),
            out_proj=self._projection([(a + "o_proj.weight", (hidden, width))]),
        )
        layer = KimiLinearLayerWeights(input_norm=take(p + "input_layernorm.weight", (hidden,)), qkv=net.in_proj,
                                       o=net.out_proj, post_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
                                       gate_up=None, down=None, kda=net)
        return self._with_mlp(layer, i)  # type: ignore[return-value]

    def _conv(self, a: str, channels: int, kernel: int, dtype: torch.dtype | None) -> torch.Tensor:
        """The q, k and v rows' convolution ``[channels, kernel]`` (in ``dtype``; None: the model's): one stored
        tensor, or the released three."""
        if self._source.has(a + "conv1d.weight"):
            return self._source.take(a + "conv1d.weight", (channels, 1, kernel), dtype)[:, 0]
        parts = [self._source.take(a + f"{x}_conv1d.weight", (channels // 3, 1, kernel), dtype)[:, 0] for x in "qkv"]
        return torch.cat(parts)

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention layers' only), computed as
        the module says; ``states`` planned for this step."""
        return self._pre_norm_hidden(input_ids, positions, kv_caches, attention, logits_indices, paths,
                                     lambda i, layer, x: None if layer.kda is None
                                     else self._kda(i, layer.kda, x, paths, states))

    def _kda(self, i: int, net: KimiDeltaWeights, x: torch.Tensor, paths: RowPaths | None,
             states: RecurrentStates | None) -> torch.Tensor:
        spec, eps = self.config.linear_attention, self.config.rms_norm_eps
        assert spec is not None and states is not None, "a hybrid model runs with its recurrent states"
        n, plan, tokens = spec.layers.index(i), states.plan, x.shape[0]
        heads, dk = spec.key_heads, spec.key_head_dim
        rank = heads * dk if net.f_b is None else dk
        mixed, forget, gate, b = linear(x, net.in_proj, paths).split([3 * heads * dk, rank, rank, heads], dim=-1)
        mixed = causal_conv1d(mixed.float() if spec.float32_mixer else mixed.contiguous(), net.conv, states.conv[n],
                              plan.slots, plan.query_lens, plan.fresh, saves=plan.saves).to(x.dtype)
        q, k, v = (t.reshape(tokens, heads, dk) for t in mixed.chunk(3, dim=-1))
        if net.f_b is not None:
            forget, gate = linear(forget, net.f_b, paths), linear(gate, net.g_b, paths)  # type: ignore[arg-type]
        forget = (forget.float() + net.dt_bias).view(tokens, heads, dk)
        decay = -net.a_rate * F.softplus(forget) if spec.decay_bound is None else \
            spec.decay_bound * torch.sigmoid(net.a_rate * forget)
        if spec.float32_mixer:  # Ling 3's gate returns the decay in the model dtype; Kimi's keeps it float32
            decay = decay.to(x.dtype)
        out = kimi_delta_rule(q, k, v, decay, b.sigmoid(), states.ssm[n], plan.slots, plan.query_lens, plan.fresh,
                              plan.saves)
        gate = gate.view(tokens, heads, dk)
        normed = F.rms_norm(out.float(), (dk,), net.norm, eps) * torch.sigmoid(gate.float())
        return linear(normed.to(x.dtype).reshape(tokens, heads * dk), net.out_proj, paths)
