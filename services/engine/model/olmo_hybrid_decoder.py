"""OLMo Hybrid's decoder (:mod:`services.engine.model.olmo_hybrid`): OLMo 2's post-norm attention layer
(:class:`~services.engine.model.olmo2_decoder.Olmo2DecoderModel`) where a layer attends, and where it is a Gated
DeltaNet layer, ``h += mix(norm(h))`` then ``h += mlp(norm(h))`` (plain RMSNorms), the mixer
:func:`~services.engine.model.hybrid_decoder.delta_net`'s over its q, k, v, g, b and a projections (stored apart, read
as one; the q, k and v convolutions too), its write strength doubled where ``negative_eigenvalues``, its output norm's
epsilon 1e-5 (FLA's, as transformers' ``OlmoHybridRMSNormGated``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths
from kernels.norm import rms_norm
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.hybrid_decoder import DeltaNetWeights, HybridLayerWeights, delta_net
from services.engine.model.olmo2_decoder import Olmo2DecoderModel

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates

OUTPUT_NORM_EPS = 1e-5


class OlmoHybridDecoderModel(Olmo2DecoderModel):
    """An :class:`Olmo2DecoderModel` with Gated DeltaNet layers; same constructor. Not served in the deterministic
    mode."""

    FUSED_OPS = False

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        if kwargs.get("deterministic"):
            raise ModelLoadError(f"{config.architecture} is not served in the deterministic mode (its linear-"
                                 "attention layers have no batch-invariant kernel here)")
        super().__init__(config, tensors, dtype, *args, **kwargs)

    def _layer(self, i: int) -> HybridLayerWeights:
        spec = self.config.linear_attention
        assert spec is not None
        if i not in spec.layers:
            base = super()._layer(i)
            return HybridLayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
        take, hidden, p = self._source.take, self.config.hidden_size, f"model.layers.{i}."
        d, heads = p + "linear_attn.", spec.value_heads
        net = DeltaNetWeights(
            in_proj=self._projection([(d + "q_proj.weight", (spec.key_dim, hidden)),
                                      (d + "k_proj.weight", (spec.key_dim, hidden)),
                                      (d + "v_proj.weight", (spec.value_dim, hidden)),
                                      (d + "g_proj.weight", (spec.value_dim, hidden)),
                                      (d + "b_proj.weight", (heads, hidden)), (d + "a_proj.weight", (heads, hidden))]),
            conv=torch.cat([take(d + f"{x}_conv1d.weight", (width, 1, spec.conv_kernel))[:, 0]
                            for x, width in (("q", spec.key_dim), ("k", spec.key_dim), ("v", spec.value_dim))]),
            dt_bias=take(d + "dt_bias", (heads,)).float(),
            a_scale=-take(d + "A_log", (heads,), torch.float32).exp(),
            norm=take(d + "o_norm.weight", (spec.value_head_dim,)),
            out_proj=self._projection([(d + "o_proj.weight", (hidden, spec.value_dim))]),
        )
        layer = HybridLayerWeights(input_norm=take(p + "input_layernorm.weight", (hidden,)), qkv=net.in_proj,
                                   o=net.out_proj, post_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
                                   gate_up=None, down=None, delta_net=net)
        return self._with_mlp(layer, i)  # type: ignore[return-value]

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention layers' only), computed as
        the module says; ``states`` planned for this step."""
        cfg, eps = self.config, self.config.rms_norm_eps
        spec = cfg.linear_attention
        assert spec is not None
        hidden = F.embedding(input_ids, self.embed)
        ropes = self.ops.rope.prepare(positions), None
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, HybridLayerWeights)
            if layer.delta_net is None:
                hidden = self._post_norm_layer(i, layer, hidden, kv_caches[self._kv_index[i]], attention, ropes, paths)
                continue
            x = rms_norm(hidden, layer.input_norm, eps)
            hidden = hidden + delta_net(cfg, i, layer.delta_net, x, paths, states,
                                        beta_scale=2.0 if spec.negative_eigenvalues else 1.0,
                                        norm_eps=OUTPUT_NORM_EPS)
            hidden = hidden + self._mlp(rms_norm(hidden, layer.post_norm, eps), layer, paths)
        return rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)


def olmo_hybrid_tensor_name(name: str) -> str:
    """A released tensor's name in the decoder: the DeltaNet layers' norms under Llama's names."""
    return name.replace(".attention_layer_norm.", ".input_layernorm.").replace(
        ".feedforward_layer_norm.", ".post_attention_layernorm.")
