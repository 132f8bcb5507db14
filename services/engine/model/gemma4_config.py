"""What Gemma 4 changes in the decoder's shape (:mod:`services.engine.model.gemma4_decoder`): attention whose heads
differ by layer, KV shared across layers, per-layer inputs, and experts beside the MLP.

**Heads per layer.** A sliding layer has ``num_key_value_heads`` KV heads of ``head_dim``; a full layer has
``global_head_dim``-wide heads (and, with ``attention_k_eq_v``, ``num_global_key_value_heads`` of them, whose values
are their keys' projection). The KV cache keeps one shape for every layer (``ModelConfig.num_kv_heads`` heads of
``ModelConfig.head_dim``: a *slot* per token and layer, the widest layer's), so that blocks, transfers and the
cache-store stay one layout. A layer views its slot as ``slot / d`` heads of its own width ``d`` and writes each of
its KV heads that many times over (:meth:`Gemma4Config.repeats`): queries of a group then read copies of their own
head, which is exact. A narrower layer's slot holds copies: memory a cache shaped per layer would save.

**KV sharing** (``num_kv_shared_layers``, the E2B/E4B models): the last layers keep no KV of their own; each attends
over the KV of the last earlier layer of its kind (``kv_sources``), as transformers' ``kv_sharing_modes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.errors import ModelLoadError


@dataclass(frozen=True)
class Gemma4Config:
    layer_heads: tuple[tuple[int, int], ...]  # per layer: (KV heads, head dim) of its attention
    kv_sources: tuple[int, ...]  # per layer: the layer whose KV it attends over (itself unless it shares)
    value_is_key: tuple[int, ...] = ()  # layers whose values are the keys' projection (attention_k_eq_v)
    per_layer_input_size: int = 0  # hidden_size_per_layer_input: each layer's input from the token (0: none)
    double_wide_layers: tuple[int, ...] = ()  # use_double_wide_mlp: the KV-sharing layers' MLP is twice as wide
    moe_beside_mlp: bool = False  # enable_moe_block: each layer adds experts' output to its dense MLP's
    final_logit_softcap: float | None = None

    def __post_init__(self) -> None:
        layers = len(self.layer_heads)
        if len(self.kv_sources) != layers:
            raise ModelLoadError(f"gemma4: {len(self.kv_sources)} KV sources for {layers} layers")
        for layer, source in enumerate(self.kv_sources):
            if not 0 <= source <= layer or self.kv_sources[source] != source \
                    or self.layer_heads[source] != self.layer_heads[layer]:
                raise ModelLoadError(f"gemma4: layer {layer} cannot attend over layer {source}'s KV")

    @property
    def shared_layers(self) -> tuple[int, ...]:
        """The layers that keep no KV (they attend over an earlier layer's)."""
        return tuple(layer for layer, source in enumerate(self.kv_sources) if source != layer)

    def repeats(self, layer: int, slot: int) -> int:
        """How many times ``layer`` writes each of its KV heads into a ``slot`` of that many values."""
        heads, dim = self.layer_heads[layer]
        return slot // dim // heads

    def check_fits(self, num_heads: int, slot: int) -> None:
        """Each layer's heads fill a ``slot`` of values in whole copies, and its query groups split evenly over
        them (see the module); otherwise the config is refused naming the layer."""
        for layer, (heads, dim) in enumerate(self.layer_heads):
            if slot % dim or (slot // dim) % heads or num_heads % (slot // dim):
                raise ModelLoadError(f"gemma4: layer {layer}'s {heads} KV heads of {dim} do not fill the KV cache's "
                                     f"{slot} values per token in whole copies for {num_heads} query heads")
