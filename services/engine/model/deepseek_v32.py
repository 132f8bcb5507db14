"""DeepSeek-V3.2 (``DeepseekV32ForCausalLM``, ``deepseek_v32``; V3.2-Exp, V3.2, V3.2-Speciale): DeepSeek-V3's latent
attention and experts with DeepSeek Sparse Attention, each query attending only the ``index_topk`` earlier tokens its
layer's lightning indexer scores highest (``index_n_heads`` heads of ``index_head_dim``; served by
:mod:`services.engine.model.dsa_decoder`). Experts on the layers ``mlp_layer_types`` calls sparse (by default from
``first_k_dense_replace`` on), routed as V3's (the sigmoid with the correction bias, within the best groups); the rope
is interleaved (V3.2 has no ``rope_interleave`` key). ``config.json`` is completed with transformers'
``DeepseekV32Config``; the multi-token-prediction layer after the last is not read. The official files are FP8 with
block scales (:mod:`services.engine.weights.fp8_blocks`), the indexer's projections among them.

Zhipu's GLM-5 (``GlmMoeDsaForCausalLM``, ``glm_moe_dsa``) is the same model with its indexer's rope in the latent's
interleaved pairs, and layers that run no indexer of their own (``indexer_types`` "shared", from
``index_topk_freq`` / ``index_skip_topk_offset`` or ``index_topk_pattern``) and attend the previous indexed layer's
picks; ``config.json`` is completed with ``GlmMoeDsaConfig``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, SparseIndex
from services.engine.model.deepseek import latent_config, sparse_mlp
from services.engine.model.hf_config import sparse_mlp_layers, with_defaults

ARCHITECTURE = "deepseek_v32"
GLM5 = "glm_moe_dsa"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import DeepseekV32Config, GlmMoeDsaConfig

    glm5 = cfg.get("model_type") == GLM5
    full = with_defaults(ARCHITECTURE, GlmMoeDsaConfig if glm5 else DeepseekV32Config, cfg)
    layers = int(full["num_hidden_layers"])
    moe = sparse_mlp(full, sparse_mlp_layers(full, layers, ARCHITECTURE), sigmoid_routing=True,
                     expert_groups=int(full.get("n_group") or 1), top_groups=int(full.get("topk_group") or 1))
    index = SparseIndex(heads=int(full["index_n_heads"]), head_dim=int(full["index_head_dim"]),
                        topk=int(full["index_topk"]), interleaved_rope=glm5,
                        shared_layers=_shared_layers(full, layers) if glm5 else ())
    return latent_config(full, ARCHITECTURE, moe, interleaved=True, index=index)


def _shared_layers(full: Mapping[str, Any], layers: int) -> tuple[int, ...]:
    """GLM-5's layers that reuse the previous indexed layer's picks (``indexer_types``, as ``GlmMoeDsaConfig``
    derives it); another length or kind is refused naming it."""
    kinds = list(full.get("indexer_types") or [])
    if len(kinds) != layers or set(kinds) - {"full", "shared"}:
        raise ModelLoadError(f"{GLM5}: indexer_types must list {layers} of full, shared; got {kinds}")
    return tuple(i for i, kind in enumerate(kinds) if kind == "shared")
