"""The attention variants a :class:`~services.engine.model.config.ModelConfig` names beside its heads: latent attention
(DeepSeek's), its sparse indexer (DeepSeek-V3.2's, GLM-5's) and MiMo-V2-Flash's per-layer attention. Plain data, no
torch."""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.errors import ModelLoadError


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash; :mod:`services.engine.model.mla_decoder`): each
    token's KV is one latent row of ``kv_lora_rank`` (normed) plus a shared rope key of ``qk_rope_head_dim``, from
    which each head's key (``qk_nope_head_dim`` + the rope key) and value (``v_head_dim``) are projected; queries
    come through a ``q_lora_rank`` bottleneck (None: one projection)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    index: SparseIndex | None = None  # DeepSeek Sparse Attention's indexer (DeepSeek-V3.2); None: dense

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config {name} must be >= 1, got {getattr(self, name)}")
        if self.q_lora_rank is not None and self.q_lora_rank < 1:
            raise ModelLoadError(f"config q_lora_rank must be >= 1 or null, got {self.q_lora_rank}")
        if self.index is not None and (self.q_lora_rank is None or self.index.head_dim < self.qk_rope_head_dim):
            raise ModelLoadError(f"an indexer needs a q_lora_rank and an index_head_dim of at least "
                                 f"qk_rope_head_dim {self.qk_rope_head_dim} (got {self.q_lora_rank}, "
                                 f"{self.index.head_dim})")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_dim(self) -> int:
        """One token's cached row: the rope key, then the latent (then the indexer's key, with one)."""
        return self.qk_rope_head_dim + self.kv_lora_rank + (0 if self.index is None else self.index.head_dim)


@dataclass(frozen=True)
class MiMoAttention:
    """Xiaomi MiMo-V2-Flash's attention (:mod:`services.engine.model.mimo_decoder`): each layer's KV heads
    (``kv_heads``; its sliding layers have twice the full layers'), values ``v_head_dim`` wide (the keys are
    ``head_dim``), each value times ``value_scale`` before it is cached, and a learned sink logit per head on the
    ``sink_layers``."""

    kv_heads: tuple[int, ...]
    v_head_dim: int
    value_scale: float
    sink_layers: tuple[int, ...]


@dataclass(frozen=True)
class SparseIndex:
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2; :mod:`services.engine.model.dsa_decoder`): each
    query attends only the ``topk`` earlier tokens of highest index score ``Σ_h w_h · relu(q_h · k / √head_dim)``,
    over ``heads`` index heads of ``head_dim`` and one index key a token (cached after its latent row)."""

    heads: int
    head_dim: int
    topk: int
    # the index query's and key's rope: the latent's interleaved pairs (GLM-5's), not rotate-half (DeepSeek-V3.2's)
    interleaved_rope: bool = False
    # the layers that run no indexer of their own and attend what the previous indexed layer picked (GLM-5's
    # ``indexer_types`` "shared"); their rows' index key dims stay 0
    shared_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "topk"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config index {name} must be >= 1, got {getattr(self, name)}")
        if 0 in self.shared_layers:
            raise ModelLoadError("the first layer must run its own indexer (indexer_types[0] is 'shared')")
