"""Gemma 1's, 2's and 3's decoder: the shared decoder's weights and projections (:class:`DecoderModel`) in
Gemma's layer.

Per layer: ``h += post_attn_norm(attention(input_norm(h)))`` then ``h += post_ff_norm(mlp(pre_ff_norm(h)))``
(Gemma 1: without the two norms after, ``GemmaConfig.post_norms``),
every norm computed in float32 and scaled by ``1 + weight`` (kept in float32: the sum is never rounded to the
serving dtype, as transformers computes it); the MLP is ``down(gelu_tanh(gate) * up)``; q and k are normed
per head (Gemma 3's ``qk_norm``); embeddings are scaled by ``sqrt(hidden)`` rounded to the serving dtype.
Sliding-window layers attend to their window (the backend's ``window``) with their own rope base; the others
attend to everything with the checkpoint's rope (and its scaling). Gemma 2 caps every attention score
(``attn_logit_softcap``, the backend's ``softcap``) and, as Gemma 3 may, the final logits. Elementwise steps
run torch's ops (no fused kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths, linear
from kernels.rope import RotaryEmbedding
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, LayerWeights, attention_options

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class GemmaLayerWeights(LayerWeights):
    pre_ff_norm: torch.Tensor | None = None
    post_ff_norm: torch.Tensor | None = None


def offset_norm_weight(weight: torch.Tensor) -> torch.Tensor:
    """Gemma's norm scale ``1 + weight``, in float32."""
    return 1.0 + weight.float()


def gemma_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * scale`` in float32 (``scale`` from :func:`offset_norm_weight`), returned
    in ``x.dtype``."""
    return F.rms_norm(x.float(), (x.shape[-1],), scale, eps).to(x.dtype)


class GemmaDecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a Gemma 2 or Gemma 3 checkpoint (``config.gemma`` set); same constructor,
    except that the fused elementwise kernels are never used."""

    FUSED_OPS = False
    OWN_LOCAL_ROPE = True  # its sliding layers rotate in its own layer

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        assert config.gemma is not None, "GemmaDecoderModel needs a Gemma config"
        if dtype == torch.float16:  # vLLM refuses it too: Gemma's activations overflow float16
            raise ModelLoadError(f"{config.architecture} is not served in float16 (its activations overflow it); "
                                 "use bfloat16 or float32")
        super().__init__(config, tensors, dtype, *args, **kwargs)
        self.final_norm = offset_norm_weight(self.final_norm)
        self.local_rope = RotaryEmbedding(config.head_dim, config.rope_length, config.gemma.local_rope_theta,
                                          self.device)
        self.scale = config.gemma.query_pre_attn_scalar**-0.5
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype, device=self.device)

    def _layer(self, i: int) -> GemmaLayerWeights:
        base = super()._layer(i)
        hidden, p = self.config.hidden_size, f"model.layers.{i}."
        layer = GemmaLayerWeights(**{f.name: getattr(base, f.name) for f in fields(base)})
        assert self.config.gemma is not None
        if self.config.gemma.post_norms:
            layer.pre_ff_norm = self._source.take(p + "pre_feedforward_layernorm.weight", (hidden,))
            layer.post_ff_norm = self._source.take(p + "post_feedforward_layernorm.weight", (hidden,))
        else:  # Gemma 1: its post_attention_layernorm is the norm before the MLP
            layer.pre_ff_norm, layer.post_norm = layer.post_norm, None
        norms = ("input_norm", "post_norm", "pre_ff_norm", "post_ff_norm", *(("q_norm", "k_norm")
                                                                               if self.config.qk_norm else ()))
        for name in norms:
            if getattr(layer, name) is not None:
                setattr(layer, name, offset_norm_weight(getattr(layer, name)))
        return layer

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`DecoderModel.logits`, with the final logit softcap where the model has one."""
        assert self.config.gemma is not None
        logits = super().logits(rows)
        cap = self.config.gemma.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract, computed as Gemma 2 and 3 do (see the module)."""
        cfg, eps = self.config, self.config.rms_norm_eps
        assert cfg.gemma is not None
        hidden = F.embedding(input_ids, self.embed) * self.embed_scale
        tables = {False: self.rope.tables(positions, self.dtype), True: self.local_rope.tables(positions, self.dtype)}
        num_tokens = input_ids.shape[0]
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x = gemma_rms_norm(hidden, layer.input_norm, eps)
            q, k, v = linear(x, layer.qkv, paths).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = q.reshape(num_tokens, cfg.num_heads, cfg.head_dim)
            k = k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            if layer.q_norm is not None:
                q, k = gemma_rms_norm(q, layer.q_norm, eps), gemma_rms_norm(k, layer.k_norm, eps)
            local = i in cfg.local_rope_layers
            cos, sin = tables[local]
            rope = self.local_rope if local else self.rope
            q, k = rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)
            v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            attn = attention.forward(q, k, v, kv_cache, self.scale, **attention_options(cfg, i))
            o = linear(attn.reshape(num_tokens, cfg.q_size), layer.o, paths)
            hidden = hidden + (o if layer.post_norm is None else gemma_rms_norm(o, layer.post_norm, eps))
            x = gemma_rms_norm(hidden, layer.pre_ff_norm, eps)
            gate, up = linear(x, layer.gate_up, paths).chunk(2, dim=-1)
            mlp = linear(F.gelu(gate, approximate="tanh") * up, layer.down, paths)
            hidden = hidden + (mlp if layer.post_ff_norm is None else gemma_rms_norm(mlp, layer.post_ff_norm, eps))
        return gemma_rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)
