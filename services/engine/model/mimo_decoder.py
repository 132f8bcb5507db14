"""Xiaomi MiMo-V2-Flash's decoder: the shared decoder's layer (:class:`DecoderModel`) with MiMo's attention
(:class:`~services.engine.model.config.MiMoAttention`), computed as transformers' ``MiMoV2FlashAttention``:

- each layer has its own number of KV heads (the sliding layers twice the full layers'); the cache's slot holds the
  widest layer's, and a narrower layer writes each of its heads that many times over, so that each query group reads
  copies of its own head (exact; Gemma 4's way, :mod:`services.engine.model.gemma4_config`);
- values are ``v_head_dim`` wide, narrower than the keys: they are cached zero-padded to the key width and the
  attention's output cut back (exact: the padding attends to zeros), after scaling by ``value_scale``;
- the sliding layers add a learned sink logit per head to each softmax (GPT-OSS's ``sinks``; released as
  ``attention_sink_bias``) and rotate with a rope of their own base over the same partial dims as the full layers'
  (``ModelConfig.local_rope_layers``, the shared decoder's :meth:`DecoderModel._rotate`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths, linear
from services.engine.model.config import MiMoAttention
from services.engine.model.decoder import DecoderModel, LayerWeights, attention_options

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend


class MiMoDecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a MiMo-V2-Flash checkpoint (see the module); same constructor."""

    FUSED_OPS = False  # the sliding layers' rope beside the full layers' (torch's, both)

    @property
    def _mimo(self) -> MiMoAttention:
        assert self.config.mimo is not None
        return self.config.mimo

    def _layer(self, i: int) -> LayerWeights:
        cfg, mimo, take = self.config, self._mimo, self._source.take
        p, hidden = f"model.layers.{i}.", cfg.hidden_size
        a, kv_width = p + "self_attn.", mimo.kv_heads[i] * cfg.head_dim
        layer = LayerWeights(
            input_norm=take(p + "input_layernorm.weight", (hidden,)),
            qkv=self._projection([(a + "q_proj.weight", (cfg.q_size, hidden)),
                                  (a + "k_proj.weight", (kv_width, hidden)),
                                  (a + "v_proj.weight", (mimo.kv_heads[i] * mimo.v_head_dim, hidden))],
                                 bias=cfg.qkv_bias),
            o=self._projection([(a + "o_proj.weight", (hidden, cfg.num_heads * mimo.v_head_dim))]),
            post_norm=take(p + "post_attention_layernorm.weight", (hidden,)), gate_up=None, down=None)
        if i in mimo.sink_layers:
            layer.sinks = take(a + "sinks", (cfg.num_heads,)).float()
        return self._with_mlp(layer, i)

    def _attention(self, i: int, layer: LayerWeights, x: torch.Tensor, kv_cache: torch.Tensor,
                   attention: AttentionBackend, rope: object, paths: RowPaths | None,
                   query_scale: torch.Tensor | None = None) -> torch.Tensor:
        cfg, mimo, tokens = self.config, self._mimo, x.shape[0]
        heads, dim, value_dim = mimo.kv_heads[i], cfg.head_dim, mimo.v_head_dim
        q, k, v = linear(x, layer.qkv, paths).split([cfg.q_size, heads * dim, heads * value_dim], dim=-1)
        q, k = self._rotate(i, q.view(tokens, cfg.num_heads, dim), k.view(tokens, heads, dim), rope)
        v = F.pad(v.view(tokens, heads, value_dim) * mimo.value_scale, (0, dim - value_dim))
        repeats = cfg.num_kv_heads // heads
        if repeats > 1:  # a narrower layer fills the slot with copies of its heads
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        attn = attention.forward(q, k, v, kv_cache, self.scale, **attention_options(cfg, i, layer.sinks))
        return linear(attn[..., :value_dim].reshape(tokens, cfg.num_heads * value_dim), layer.o, paths)
