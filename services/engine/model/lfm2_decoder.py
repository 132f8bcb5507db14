"""The decoder of Liquid AI's LFM2 (``lfm2``) and LFM3: gated short-convolution layers (a recurrent state per sequence,
no KV; ``ModelConfig.short_conv``) between Qwen3-style attention layers, each followed by a SwiGLU MLP.

Per layer: ``h += mix(norm(h))``, then ``h += mlp(norm(h))`` (plain RMSNorms); LFM3 norms each block's output too
(``sandwich_norms``: ``h += norm(mix(norm(h)))``), gates each attention head's output by the sigmoid of
``g_proj(norm(h))`` (``attention_head_gate``), and rotates its sliding layers with a plain rope of their own
(``local_rope_layers``) beside the full layers' proportional one, both in float32 (``rope_in_float32``, as
transformers' LFM3 rotates). A convolution layer projects ``B``,
``C`` and ``x`` (``in_proj``, in that order), convolves ``B · x`` causally per channel over the last
``conv_kernel`` inputs (no activation: :func:`kernels.gated_delta.causal_conv1d` with ``silu=False``), multiplies by
``C`` and projects out. The states live in the :class:`~services.engine.recurrent_states.RecurrentStates` the model
runner passes to :meth:`Lfm2DecoderModel.final_hidden`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.gated_delta import causal_conv1d
from kernels.linear import LinearWeight, RowPaths, linear
from kernels.norm import rms_norm
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, LayerWeights, local_rope

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class ShortConvWeights:
    in_proj: LinearWeight  # [3 * hidden, hidden]: B, C, x rows
    conv: torch.Tensor  # [hidden, conv_kernel]
    out_proj: LinearWeight


@dataclass
class Lfm2LayerWeights(LayerWeights):
    conv: ShortConvWeights | None = None  # a convolution layer's (its qkv and o are unused then)


class Lfm2DecoderModel(DecoderModel):
    """A :class:`DecoderModel` over an LFM2 checkpoint; same constructor. Not served in the deterministic mode when
    it has convolution layers."""

    FUSED_OPS = False
    OWN_LOCAL_ROPE = True  # its sliding layers rotate in its own layer

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        if config.short_conv is not None and kwargs.get("deterministic"):
            raise ModelLoadError(f"{config.architecture} is not served in the deterministic mode (its convolution "
                                 "layers' state has no batch-invariant path here)")
        super().__init__(config, tensors, dtype, *args, **kwargs)
        self.local_rope = local_rope(config, self.device, dtype)

    def _layer(self, i: int) -> Lfm2LayerWeights:
        spec = self.config.short_conv
        if spec is None or i not in spec.layers:
            base = super()._layer(i)
            return Lfm2LayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
        take, hidden, c = self._source.take, self.config.hidden_size, f"model.layers.{i}.conv."
        conv = ShortConvWeights(
            in_proj=self._projection([(c + "in_proj.weight", (3 * hidden, hidden))]),
            conv=take(c + "conv.weight", (hidden, 1, spec.conv_kernel))[:, 0],
            out_proj=self._projection([(c + "out_proj.weight", (hidden, hidden))]),
        )
        p = f"model.layers.{i}."
        layer = Lfm2LayerWeights(input_norm=take(p + "input_layernorm.weight", (hidden,)), qkv=conv.in_proj,
                                 o=conv.out_proj, post_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
                                 gate_up=None, down=None, conv=conv)
        if self.config.sandwich_norms:  # LFM3's, on the convolution's output too
            layer.attn_out_norm = take(p + "post_self_attn_layernorm.weight", (hidden,))
            layer.mlp_out_norm = take(p + "post_mlp_layernorm.weight", (hidden,))
        return self._with_mlp(layer, i)  # type: ignore[return-value]

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention layers' only), computed as
        the module says; ``states`` planned for this step."""
        eps = self.config.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed)
        # LFM3's rope_in_float32: both ropes are Float32Rope (the shared decoder's and local_rope's choice)
        rope = _StepRopes(self.ops.rope.prepare(positions),
                          None if self.local_rope is None else self.local_rope.prepare(positions))
        for i, layer in enumerate(self.layers):
            x = rms_norm(hidden, layer.input_norm, eps)
            if layer.conv is not None:
                mixed = self._short_conv(i, layer.conv, x, paths, states)
            else:
                mixed = self._attention(i, layer, x, kv_caches[self._kv_index[i]], attention, rope, paths)
            hidden = hidden + _normed(mixed, layer.attn_out_norm, eps)
            hidden = hidden + _normed(self._mlp(rms_norm(hidden, layer.post_norm, eps), layer, paths),
                                      layer.mlp_out_norm, eps)
        return rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

    def _rotate(self, i: int, q: torch.Tensor, k: torch.Tensor, rope: object) -> tuple[torch.Tensor, torch.Tensor]:
        """LFM3's sliding layers rotate with their plain rope (``local_rope_layers``), the others with the main one
        (LFM3's full layers': proportional)."""
        assert isinstance(rope, _StepRopes)
        if i in self.config.local_rope_layers:
            assert self.local_rope is not None
            return self.local_rope(q, k, rope.local)
        return self.ops.rope(q, k, rope.main)

    def _short_conv(self, i: int, net: ShortConvWeights, x: torch.Tensor, paths: RowPaths | None,
                    states: RecurrentStates | None) -> torch.Tensor:
        spec = self.config.short_conv
        assert spec is not None and states is not None, "a hybrid model runs with its recurrent states"
        n, plan = spec.layers.index(i), states.plan
        b, c, xs = linear(x, net.in_proj, paths).chunk(3, dim=-1)
        mixed = causal_conv1d(b * xs, net.conv, states.conv[n], plan.slots, plan.query_lens, plan.fresh,
                              saves=plan.saves, silu=False)
        return linear(c * mixed, net.out_proj, paths)


@dataclass(frozen=True)
class _StepRopes:
    """A step's prepared rope tables: the main rope's and the local layers' (None without any)."""

    main: Any
    local: Any


def _normed(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``x`` through its block's output norm (LFM3's sandwich norms), or as it is without one."""
    return x if weight is None else rms_norm(x, weight, eps)


def conv_from_gguf(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A llama.cpp ``lfm2`` file's convolution weights with the channel dim its converter squeezed out
    (``[hidden, taps]`` → transformers' ``[hidden, 1, taps]``; the GGUF loader's hook)."""
    return {name: t.unsqueeze(1) if name.endswith(".conv.conv.weight") and t.dim() == 2 else t
            for name, t in tensors.items()}
