"""The decoder of Falcon-H1 (:mod:`services.engine.model.falcon_h1`): in every layer a Mamba-2 mixer (Granite 4.0-H's,
:mod:`services.engine.model.mamba_decoder`) and the shared decoder's attention run side by side on the normed input,
their outputs scaled and summed into the residual stream, then a SwiGLU MLP whose gate and output are scaled; each
layer keeps its KV (``kv_caches[i]``) and its recurrent state (``states.conv[i]``, ``states.ssm[i]``). The scales are
``ModelConfig.falcon_h1``'s (:class:`~services.engine.model.falcon_h1.FalconH1Scales`), applied where transformers
applies them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths, linear
from kernels.norm import rms_norm
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, LayerWeights
from services.engine.model.mamba_decoder import MambaDecoderModel, MambaLayerWeights, MambaWeights, gated_group_norm

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


class FalconH1DecoderModel(MambaDecoderModel):
    """A :class:`MambaDecoderModel` over a Falcon-H1 checkpoint; same constructor."""

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        assert config.falcon_h1 is not None and config.mamba is not None, "Falcon-H1's scales and mixers"
        super().__init__(config, tensors, dtype, *args, **kwargs)
        spec, ssm = config.mamba, config.falcon_h1.ssm
        groups = spec.groups * spec.state_size
        sections = [spec.intermediate, spec.intermediate, groups, groups, spec.heads]  # z, x, B, C, dt
        self._mup = torch.cat([torch.full((n,), m) for n, m in zip(sections, ssm, strict=True)]).to(
            self.device, dtype)

    def _layer(self, i: int) -> MambaLayerWeights:
        scales = self.config.falcon_h1
        assert scales is not None
        base = DecoderModel._layer(self, i)
        layer = MambaLayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
        layer.mamba = self._mamba_weights(f"model.layers.{i}.mamba.", norm=scales.mamba_norm)
        return layer

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract, computed as the module says; ``states`` planned for this
        step."""
        cfg, eps, scales = self.config, self.config.rms_norm_eps, self.config.falcon_h1
        assert scales is not None and cfg.multipliers is not None
        hidden = F.embedding(input_ids, self.embed) * cfg.multipliers.embedding
        rope = self.ops.rope.prepare(positions)
        for i, layer in enumerate(self.layers):
            assert layer.mamba is not None
            x = rms_norm(hidden, layer.input_norm, eps)
            mixed = self._mamba(i, layer.mamba, x, paths, states) * scales.ssm_out
            attended = self._attention(i, layer, x * scales.attention_in, kv_caches[self._kv_index[i]], attention,
                                       rope, paths) * scales.attention_out
            hidden = hidden + (mixed + attended)
            hidden = hidden + self._mlp(rms_norm(hidden, layer.post_norm, eps), layer, paths)
        return rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

    def _mamba(self, i: int, net: MambaWeights, x: torch.Tensor, paths: RowPaths | None,
               states: RecurrentStates | None) -> torch.Tensor:
        scales = self.config.falcon_h1
        assert scales is not None
        y, gate = self._ssd(i, net, linear(x * scales.ssm_in, net.in_proj, paths) * self._mup, states)
        return linear(gated_group_norm(y, gate, net.norm, self.config, scales.norm_before_gate).to(x.dtype),
                      net.out_proj, paths)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights, paths: RowPaths | None) -> torch.Tensor:
        scales = self.config.falcon_h1
        assert scales is not None
        gate, up = linear(x, layer.gate_up, paths).chunk(2, dim=-1)
        return linear(F.silu(gate * scales.mlp_gate) * up, layer.down, paths) * scales.mlp_down
