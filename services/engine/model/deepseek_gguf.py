"""llama.cpp's ``deepseek2`` GGUF files (DeepSeek-V3, V3.1, R1, Kimi K2, V2-Lite and GLM-4.7-Flash, as its converter
writes them), read as its loader reads them into DeepSeek's latent attention (:mod:`services.engine.model.deepseek`).
Their tokenizers split text as their files say (DeepSeek-V3's, V2's ``deepseek-llm``, Kimi K2's, GLM's:
:data:`services.engine.gguf_pre_splits.PRE_SPLITS`).

- GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``) is DeepSeek-V3's model with one expert group; its files may carry the
  multi-token-prediction layer as a last block (``nextn_predict_layers``), which is not read. Its latent norms keep
  transformers' 1e-6 (llama.cpp's use the file's epsilon).

- The heads: ``attention.key_length_mla`` and ``value_length_mla`` (the MLA files' own; ``key_length`` and
  ``value_length`` are the latent's there), else ``key_length``/``value_length`` (files from before llama.cpp's MLA
  format); ``rope.dimension_count`` of each the rope part; ``head_count`` query and KV heads (``head_count_kv`` is the
  latent's 1).
- ``kv_b_proj``: the MLA files split it per head into ``attn_k_b`` (its key rows, transposed: ``[H, kv_lora, nope]``)
  and ``attn_v_b`` (``[H, v, kv_lora]``); :func:`kv_b_from_gguf` joins them back. Older files store ``attn_kv_b``.
- Routing: ``expert_gating_func`` 2 is V3's sigmoid with the correction bias among ``expert_group_used_count`` of
  ``expert_group_count`` groups; 1 (or none: llama.cpp's default) a softmax over all experts (V2-Lite); none with
  the correction bias the sigmoid (GLM-4.7-Flash's files). A softmax over
  groups (V2's ``group_limited_greedy``) is refused by name: llama.cpp scores a group by its top two experts' sum,
  transformers by its best. ``expert_weights_norm`` renormalises, ``expert_weights_scale`` scales (0 or 1: none).
- Yarn from ``rope.scaling.*``: ``yarn_log_multiplier`` is ``0.1 · mscale_all_dim`` (the converter's), and the scores
  scale by ``mscale²`` as transformers'; the rope's own magnitude is 1, as both compute it.
- Mistral's own checkpoints (Mistral Large 3, Small 4), which llama.cpp converts as ``deepseek2`` too, carry
  Ministral 3's query temperature (``attention.temperature_scale``, ``temperature_length``): read
  (:func:`with_file_ids`).
- q and k rows as the checkpoint's (the converter permutes nothing); the rope rotates pairs of adjacent dims, as
  llama.cpp's NORM rope and transformers' ``rope_interleave`` do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.deepseek import ARCHITECTURE, latent_config, sparse_mlp
from services.engine.model.gguf_config import (
    SIGMOID_GATING,
    SOFTMAX_GATING,
    GGUFFields,
    gguf_base_fields,
    gguf_turn_end_ids,
)

if TYPE_CHECKING:  # the config readers are torch-free (the gateway's process reads a file's config): the hook is not
    import torch

GGUF_ARCHITECTURE = "deepseek2"


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    cfg, f = latent_fields(fields, GGUF_ARCHITECTURE)
    config = latent_config(cfg, ARCHITECTURE, _experts(f, cfg["num_hidden_layers"]), interleaved=True)
    return with_file_ids(config, fields, GGUF_ARCHITECTURE)


def with_file_ids(config: ModelConfig, fields: Mapping[str, Any], arch: str) -> ModelConfig:
    """``config`` with the file's name, BOS and end ids, and its query temperature: ``attention.temperature_scale``
    over ``attention.temperature_length`` (else the yarn's original context; llama.cpp's converter writes both for
    Mistral's own checkpoints, Mistral Large 3's and Small 4's, whose queries past that context scale up)."""
    base = gguf_base_fields(fields, arch)
    f = GGUFFields(fields, arch)
    beta = f.decimal("attention.temperature_scale", 0.0)
    period = int(f.get("attention.temperature_length") or f.get("rope.scaling.original_context_length")
                 or base["max_position"]) if beta else 0
    return dataclasses.replace(config, name=base["name"], bos_token_id=base["bos_token_id"],
                               eos_token_ids=gguf_turn_end_ids(base, fields), query_temperature_beta=beta,
                               query_temperature_period=period)


def latent_fields(fields: Mapping[str, Any], arch: str) -> tuple[dict[str, Any], GGUFFields]:
    """The ``config.json`` fields of an ``arch`` file's latent attention, its widths and its rope (experts not
    included), for :func:`~services.engine.model.deepseek.latent_config`; and the file's fields."""
    f = GGUFFields(fields, arch)
    base = gguf_base_fields(fields, arch)
    # the file's last nextn_predict_layers blocks are GLM-4.7-Flash's multi-token-prediction layer (not read)
    layers, heads = base["num_layers"] - int(f.get("nextn_predict_layers") or 0), base["num_heads"]
    mla_k, mla_v = int(f.get("attention.key_length_mla") or 0), int(f.get("attention.value_length_mla") or 0)
    qk_head, v_head = (mla_k, mla_v) if mla_k and mla_v else (int(f.key("attention.key_length")),
                                                                int(f.key("attention.value_length")))
    rope_dim = int(f.key("rope.dimension_count"))
    q_lora = f.get("attention.q_lora_rank")
    cfg: dict[str, Any] = {
        "model_type": GGUF_ARCHITECTURE, "hidden_act": "silu", "vocab_size": base["vocab_size"],
        "hidden_size": base["hidden_size"], "intermediate_size": base["intermediate_size"],
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
        "rms_norm_eps": base["rms_norm_eps"], "rope_theta": base["rope_theta"],
        "max_position_embeddings": base["max_position"], "rope_scaling": _yarn(f),
        "kv_lora_rank": int(f.key("attention.kv_lora_rank")), "q_lora_rank": None if not q_lora else int(q_lora),
        "qk_rope_head_dim": rope_dim, "qk_nope_head_dim": qk_head - rope_dim, "v_head_dim": v_head,
        "tie_word_embeddings": True,  # decided by the loader from the tensors present
    }
    return cfg, f


def _experts(f: GGUFFields, layers: int) -> MoEConfig | None:
    experts = int(f.get("expert_count") or 0)
    if not experts:
        return None
    gating = int(f.get("expert_gating_func") or _default_gating(f))
    groups, used = int(f.get("expert_group_count") or 1), int(f.get("expert_group_used_count") or 1)
    if gating == SIGMOID_GATING:
        routing: dict[str, Any] = dict(sigmoid_routing=True, expert_groups=groups, top_groups=used)
    elif gating == SOFTMAX_GATING and groups <= 1:
        routing = dict(group_limited_softmax=True)
    elif gating == SOFTMAX_GATING:
        raise ModelLoadError(f"GGUF deepseek2: softmax routing over {groups} expert groups is not served (llama.cpp "
                             "scores a group by the sum of its top two experts, transformers' DeepSeek-V2 by its best)")
    else:
        raise ModelLoadError(f"GGUF deepseek2: expert_gating_func {gating} is not supported (1: softmax, 2: sigmoid)")
    cfg = {"n_routed_experts": experts, "num_experts_per_tok": int(f.key("expert_used_count")),
           "moe_intermediate_size": int(f.key("expert_feed_forward_length")),
           "n_shared_experts": int(f.get("expert_shared_count") or 0),
           "norm_topk_prob": bool(f.get("expert_weights_norm")),
           "routed_scaling_factor": f.decimal("expert_weights_scale", 1.0)}  # 0: none
    first_dense = int(f.get("leading_dense_block_count") or 0)
    return sparse_mlp(cfg, tuple(range(first_dense, layers)), **routing)


def _default_gating(f: GGUFFields) -> int:
    """The routing of a file without ``expert_gating_func``: V2's softmax, as llama.cpp reads one; but a file with
    the correction bias (``exp_probs_b``) routes by the sigmoid, as GLM-4.7-Flash's files (whose config names no
    scoring function, so its converter writes none) do and llama.cpp reads them (by their shape)."""
    return SIGMOID_GATING if f.has_tensor(".exp_probs_b.bias") else SOFTMAX_GATING


def _yarn(f: GGUFFields) -> dict[str, Any] | None:
    """The file's yarn as transformers' ``rope_scaling`` (None without one; another scaling is refused by name)."""
    kind = f.get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind != "yarn":
        raise ModelLoadError(f"GGUF {f.arch}: rope scaling {kind!r} is not supported (only yarn)")
    # the converter writes 0.1 · mscale_all_dim; rounded back from float32
    mscale = round(float(f.get("rope.scaling.yarn_log_multiplier") or 0.0) / 0.1, 6)
    return {"rope_type": "yarn", "factor": float(f.key("rope.scaling.factor")),
            "original_max_position_embeddings": int(f.key("rope.scaling.original_context_length")),
            "beta_fast": float(f.get("rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(f.get("rope.scaling.yarn_beta_slow", 1.0)), "mscale": mscale, "mscale_all_dim": mscale}


def kv_b_from_gguf(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The loader's hook: each layer's ``attn_k_b`` and ``attn_v_b`` (kept stacked as ``self_attn.gguf_k_b`` and
    ``gguf_v_b``) joined back into transformers' ``kv_b_proj`` ``[H · (nope + v), kv_lora]``."""
    import torch

    mla = config.mla
    assert mla is not None
    out = dict(tensors)
    for name in [n for n in tensors if n.endswith(".self_attn.gguf_k_b")]:
        prefix = name.removesuffix("gguf_k_b")
        k_b, v_b = out.pop(name), out.pop(prefix + "gguf_v_b", None)
        want = (config.num_heads, mla.kv_lora_rank)
        if v_b is None or (k_b.shape[0], k_b.shape[1]) != want or (v_b.shape[0], v_b.shape[2]) != want:
            raise ModelLoadError(f"GGUF {config.architecture} file: {prefix}: attn_k_b {tuple(k_b.shape)} and attn_v_b "
                                 f"{None if v_b is None else tuple(v_b.shape)} are not [heads, kv_lora, nope] and "
                                 "[heads, v, kv_lora]")
        joined = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
        out[prefix + "kv_b_proj.weight"] = joined.reshape(-1, mla.kv_lora_rank).contiguous()
    if any(n.endswith(".self_attn.gguf_v_b") for n in out):
        raise ModelLoadError(f"GGUF {config.architecture} file: an attn_v_b without its attn_k_b")
    return out
