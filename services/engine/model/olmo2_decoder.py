"""OLMo 2's and OLMo 3's layer over the shared decoder's weights and projections: ``h += norm(attention(h))`` then
``h += norm(mlp(h))``, q and k normed over all their heads at once (see :mod:`services.engine.model.olmo2`; OLMo 3's
sliding layers rotate with their own plain rope, :mod:`services.engine.model.olmo3`); EXAONE 4.0's the same layer with
q and k normed head by head (``ModelConfig.qk_norm``) and its global layers unrotated
(:mod:`services.engine.model.exaone4`); FlexOlmo's with OLMoE's experts as its MLP
(:mod:`services.engine.model.flex_olmo`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths, linear
from kernels.norm import rms_norm
from services.engine.model.decoder import DecoderModel, LayerWeights, attention_options, local_rope

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


class Olmo2DecoderModel(DecoderModel):
    """A :class:`DecoderModel` over an OLMo 2 checkpoint. Its layers hold the norms on the blocks' outputs as
    ``attn_out_norm`` and ``mlp_out_norm`` (``input_norm`` and ``post_norm`` unused: None), and q/k norms of the
    whole projection's width. OLMo 3's sliding layers rotate with torch's rope of their own base in the model dtype
    (``local_rope``), also where a GPU's full layers take FlashInfer's fused rope."""

    OWN_LOCAL_ROPE = True  # OLMo 3's sliding layers rotate in its own layer

    def __init__(self, config, tensors, dtype, *args, **kwargs):
        super().__init__(config, tensors, dtype, *args, **kwargs)
        self.local_rope = local_rope(config, self.device, dtype)

    def _layer(self, i: int) -> LayerWeights:
        cfg, take, p = self.config, self._source.take, f"model.layers.{i}."
        hidden, a = cfg.hidden_size, p + "self_attn."
        return self._with_mlp(LayerWeights(
            input_norm=None, post_norm=None,  # type: ignore[arg-type]  (OLMo 2 norms no block's input)
            qkv=self._projection(self._qkv_parts(a), bias=cfg.qkv_bias),
            o=self._projection([(a + "o_proj.weight", (hidden, cfg.q_size))], bias=cfg.o_bias),
            gate_up=None, down=None,
            q_norm=take(a + "q_norm.weight", (cfg.head_dim if cfg.qk_norm else cfg.q_size,)),
            k_norm=take(a + "k_norm.weight", (cfg.head_dim if cfg.qk_norm else cfg.kv_size,)),
            attn_out_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
            mlp_out_norm=take(p + "post_feedforward_layernorm.weight", (hidden,)),
        ), i)

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract, in OLMo 2's layer."""
        hidden = F.embedding(input_ids, self.embed)
        ropes = self.ops.rope.prepare(positions), \
            None if self.local_rope is None else self.local_rope.prepare(positions)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            hidden = self._post_norm_layer(i, layer, hidden, kv_cache, attention, ropes, paths)
        return rms_norm(hidden.index_select(0, logits_indices), self.final_norm, self.config.rms_norm_eps)

    def _post_norm_layer(self, i: int, layer: LayerWeights, hidden: torch.Tensor, kv_cache: torch.Tensor,
                         attention: AttentionBackend, ropes: tuple[object, object], paths: RowPaths | None
                         ) -> torch.Tensor:
        """The residual stream after OLMo 2's layer ``i`` (``ropes``: the step's full and local rope tables)."""
        cfg, eps, num_tokens = self.config, self.config.rms_norm_eps, hidden.shape[0]
        q, k, v = linear(hidden, layer.qkv, paths).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        if not cfg.qk_norm:  # OLMo's: over the whole projection
            q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
        q = q.view(num_tokens, cfg.num_heads, cfg.head_dim)
        k = k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:  # EXAONE 4.0's: head by head
            q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
        if i in cfg.local_rope_layers:
            q, k = self.local_rope(q, k, ropes[1])
        elif i not in cfg.nope_layers:  # EXAONE 4.0's global layers attend unrotated
            q, k = self.ops.rope(q, k, ropes[0])
        v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        attn = attention.forward(q, k, v, kv_cache, self.scale, **attention_options(cfg, i))
        o = linear(attn.reshape(num_tokens, cfg.q_size), layer.o, paths)
        hidden = hidden + rms_norm(o, layer.attn_out_norm, eps)
        return hidden + rms_norm(self._mlp(hidden, layer, paths), layer.mlp_out_norm, eps)
