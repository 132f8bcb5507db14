"""The decoder of Liquid AI's LFM2 (``lfm2``): gated short-convolution layers (a recurrent state per sequence, no KV;
``ModelConfig.short_conv``) between Qwen3-style attention layers, each followed by a SwiGLU MLP.

Per layer: ``h += mix(norm(h))``, then ``h += mlp(norm(h))`` (plain RMSNorms). A convolution layer projects ``B``,
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
from services.engine.model.decoder import DecoderModel, LayerWeights

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

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        if config.short_conv is not None and kwargs.get("deterministic"):
            raise ModelLoadError(f"{config.architecture} is not served in the deterministic mode (its convolution "
                                 "layers' state has no batch-invariant path here)")
        super().__init__(config, tensors, dtype, *args, **kwargs)

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
        return self._with_mlp(layer, i)  # type: ignore[return-value]

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention layers' only), computed as
        the module says; ``states`` planned for this step."""
        eps = self.config.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed)
        rope = self.ops.rope.prepare(positions)
        for i, layer in enumerate(self.layers):
            x = rms_norm(hidden, layer.input_norm, eps)
            if layer.conv is not None:
                hidden = hidden + self._short_conv(i, layer.conv, x, paths, states)
            else:
                hidden = hidden + self._attention(i, layer, x, kv_caches[self._kv_index[i]], attention, rope, paths)
            hidden = hidden + self._mlp(rms_norm(hidden, layer.post_norm, eps), layer, paths)
        return rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

    def _short_conv(self, i: int, net: ShortConvWeights, x: torch.Tensor, paths: RowPaths | None,
                    states: RecurrentStates | None) -> torch.Tensor:
        spec = self.config.short_conv
        assert spec is not None and states is not None, "a hybrid model runs with its recurrent states"
        n, plan = spec.layers.index(i), states.plan
        b, c, xs = linear(x, net.in_proj, paths).chunk(3, dim=-1)
        mixed = causal_conv1d(b * xs, net.conv, states.conv[n], plan.slots, plan.query_lens, plan.fresh,
                              saves=plan.saves, silu=False)
        return linear(c * mixed, net.out_proj, paths)


def conv_from_gguf(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A llama.cpp ``lfm2`` file's convolution weights with the channel dim its converter squeezed out
    (``[hidden, taps]`` → transformers' ``[hidden, 1, taps]``; the GGUF loader's hook)."""
    return {name: t.unsqueeze(1) if name.endswith(".conv.conv.weight") and t.dim() == 2 else t
            for name, t in tensors.items()}
