"""Baidu's ERNIE 4.5 (``ernie4_5``: ERNIE-4.5-0.3B; ``ernie4_5_moe``: ERNIE-4.5-21B-A3B and 300B-A47B, the
``-PT`` checkpoints transformers reads): Llama's decoder with rope on pairs of adjacent dims
(``ModelConfig.rope_interleaved``, as GLM-4's, over the whole head; in float32, rounded once, as transformers
rotates: ``rope_in_float32``).

The MoE adds, on the layers ``moe_layer_interval``, ``moe_layer_start_index`` and ``moe_layer_end_index`` pick:
experts routed by the softmax of float32 router logits, chosen by softmax plus a per-expert correction bias
(``moe_statics.e_score_correction_bias``) and weighted by the softmax alone, renormalised
(:attr:`~services.engine.model.config.MoEConfig.biased_choice`); ``moe_num_shared_experts`` shared experts as one
ungated MLP; the renormalisation's floor is ``moe_norm_min``'s default (1e-12) whatever the config says. Its
multi-token-prediction weights (``mtp*``) are not read. ``use_bias`` (a bias on every projection, the MLP's too) is
refused.

llama.cpp's ``ernie4_5`` and ``ernie4_5-moe`` GGUF files (:func:`config_from_gguf`) hold the layer unpermuted (its rope
on adjacent pairs, as here); the MoE's layers are those from ``leading_dense_block_count`` whose index + 1 is a
multiple of ``interleave_moe_layer_step`` (llama.cpp's rule: the checkpoint's end index is not written), routed as
above (the choice biased where the file holds ``exp_probs_b``), the shared experts ``expert_shared_feed_forward_length``
wide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, required

ARCHITECTURE = "ernie4_5"
GGUF_ARCHITECTURE = ("ernie4_5", "ernie4_5-moe")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    if cfg.get("use_bias"):
        raise ModelLoadError(f"{cfg.get('model_type')}: use_bias (a bias on every projection, the MLP's too) is "
                             "not supported")
    defaults = {"rms_norm_eps": 1e-5, "tie_word_embeddings": True, "rope_theta": 500000.0}  # Ernie4_5Config's
    if cfg.get("model_type") == "ernie4_5":
        defaults["head_dim"] = 128  # the dense config's (the MoE's is hidden / heads)
    cfg = {**defaults, **{k: v for k, v in cfg.items() if v is not None}}
    fields = base_fields(cfg, ARCHITECTURE)
    moe = _experts(cfg, fields["num_layers"]) if cfg.get("model_type") == "ernie4_5_moe" else None
    return ModelConfig(**fields, rope_interleaved=True, moe=moe, rope_in_float32=True)


def _experts(cfg: Mapping[str, Any], layers: int) -> MoEConfig:
    start, interval = int(cfg.get("moe_layer_start_index", 1)), int(cfg.get("moe_layer_interval", 1))
    end = int(cfg.get("moe_layer_end_index", -1))
    end = layers - 1 if end == -1 else end
    if interval < 1:
        raise ModelLoadError(f"ernie4_5_moe: moe_layer_interval must be >= 1, got {interval}")
    width = int(cfg.get("moe_intermediate_size", 1536))
    return MoEConfig(
        num_experts=int(required(cfg, "moe_num_experts")), top_k=int(required(cfg, "moe_k")),
        intermediate_size=width, norm_topk_prob=True, biased_choice=True,
        sparse_layers=tuple(i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end),
        shared_expert_intermediate_size=width * int(cfg.get("moe_num_shared_experts", 2)) or None,
        shared_expert_gated=False,
    )


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    arch = str(fields.get("general.architecture"))
    f = GGUFFields(fields, arch)
    base = gguf_base_fields(fields, arch)
    base = {**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)}
    if arch == "ernie4_5":
        return ModelConfig(**base, rope_interleaved=True, rope_in_float32=True)
    layers, start = base["num_layers"], int(f.get("leading_dense_block_count") or 0)
    interval = int(f.get("interleave_moe_layer_step") or 1)
    width = int(f.key("expert_feed_forward_length"))
    shared = int(f.get("expert_shared_count") or 0)
    moe = MoEConfig(
        num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")), intermediate_size=width,
        norm_topk_prob=True, biased_choice=f.has_tensor(".exp_probs_b.bias"),
        sparse_layers=tuple(i for i in range(start, layers) if (i + 1) % interval == 0),
        shared_expert_intermediate_size=(int(f.get("expert_shared_feed_forward_length") or 0) or width * shared)
        if shared else None,
        shared_expert_gated=False,
    )
    return ModelConfig(**base, rope_interleaved=True, moe=moe, rope_in_float32=True)


def ernie4_5_tensor_name(name: str) -> str | None:
    """An ERNIE 4.5 checkpoint tensor's name in the shared decoder (its correction bias is the router's; its shared
    experts the decoder's shared expert); None for the multi-token-prediction weights."""
    if "mtp" in name:
        return None
    for stored in (".mlp.gate.moe_statics.", ".mlp.moe_statics."):  # transformers 5's in-memory name, the files'
        name = name.replace(stored, ".mlp.gate.")
    return name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")
