"""Qwen3.5 (dense and MoE; the text model of its multimodal checkpoints) and Qwen3-Next: hybrid decoders whose
layers are mostly Gated DeltaNet (linear attention with a recurrent state), one in ``full_attention_interval``
(4) full attention with an output gate (:mod:`services.engine.model.hybrid_decoder`).

The MoE variants route as Qwen2-MoE does, with a sigmoid-gated shared expert: Qwen3.5-MoE on every layer with
the top-k renormalised, Qwen3-Next per ``decoder_sparse_step``/``mlp_only_layers`` and ``norm_topk_prob``. The
vision tower and the multi-token-prediction layers (``mtp.*``) are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import LinearAttention, ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_rope, hf_rope_parameters
from services.engine.model.hf_config import base_fields, required, with_defaults
from services.engine.model.qwen3_moe import sparse_layers

ARCHITECTURE = "qwen3_5"
GGUF_DENSE, GGUF_MOE, GGUF_NEXT = "qwen35", "qwen35moe", "qwen3next"
_GGUF_TEXT_TYPES = {GGUF_DENSE: "qwen3_5_text", GGUF_MOE: "qwen3_5_moe_text", GGUF_NEXT: "qwen3_next"}
LAYER_KINDS = ("linear_attention", "full_attention")
_MULTIMODAL = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
_SKIPPED = ("mtp.", "model.visual.", "visual.")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hybrid_config(cfg, ARCHITECTURE)


def hybrid_config(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    """The config of a Qwen3.5 (``architecture`` "qwen3_5") or Qwen3-Next ("qwen3_next") ``config.json``."""
    text = _text_config(cfg, architecture)
    if text["model_type"] == "qwen3_5_moe_text" and text.get("intermediate_size") is None:
        # every layer's MLP is experts: Qwen3_5MoeTextConfig has no dense width, which nothing here reads
        text["intermediate_size"] = text.get("moe_intermediate_size")
    if text.get("attention_bias"):
        raise ModelLoadError(f"{architecture}: attention_bias is not supported (no release has it)")
    fields = base_fields(text, architecture, partial_rotary=True)
    kinds = list(text.get("layer_types") or [])
    if len(kinds) != fields["num_layers"] or set(kinds) - set(LAYER_KINDS):
        raise ModelLoadError(f"{architecture}: layer_types must list {fields['num_layers']} of "
                             f"{', '.join(LAYER_KINDS)}, got {kinds}")
    linear = LinearAttention(
        layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
        key_heads=int(required(text, "linear_num_key_heads")),
        value_heads=int(required(text, "linear_num_value_heads")),
        key_head_dim=int(required(text, "linear_key_head_dim")),
        value_head_dim=int(required(text, "linear_value_head_dim")),
        conv_kernel=int(required(text, "linear_conv_kernel_dim")))
    return ModelConfig(**fields, qk_norm=True, attn_output_gate=True, linear_attention=linear,
                       moe=_experts(text, fields["num_layers"]))


def _experts(text: Mapping[str, Any], num_layers: int) -> MoEConfig | None:
    if not text.get("num_experts"):
        return None
    moe_text = text["model_type"] == "qwen3_5_moe_text"  # every layer sparse, the top-k always renormalised
    return MoEConfig(
        num_experts=int(text["num_experts"]), top_k=int(required(text, "num_experts_per_tok")),
        intermediate_size=int(required(text, "moe_intermediate_size")),
        norm_topk_prob=True if moe_text else bool(text.get("norm_topk_prob", True)),
        sparse_layers=tuple(range(num_layers)) if moe_text else sparse_layers(
            num_layers, int(text.get("decoder_sparse_step", 1)), list(text.get("mlp_only_layers") or [])),
        shared_expert_intermediate_size=int(required(text, "shared_expert_intermediate_size")))


def _text_config(cfg: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """The text model's config with transformers' defaults (a multimodal config's ``text_config``)."""
    import transformers

    model_type = str(cfg.get("model_type"))
    text = dict(cfg)
    if model_type in _MULTIMODAL:
        text = dict(cfg.get("text_config") or {})
        for key in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):
            if cfg.get(key) is not None:
                text.setdefault(key, cfg[key])
        model_type = _MULTIMODAL[model_type]
    text["model_type"] = model_type
    classes = {"qwen3_5_text": "Qwen3_5TextConfig", "qwen3_5_moe_text": "Qwen3_5MoeTextConfig",
               "qwen3_next": "Qwen3NextConfig"}
    return with_defaults(architecture, getattr(transformers, classes[model_type]), text)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``qwen35``, ``qwen35moe`` or ``qwen3next`` file's config: its metadata read into the text config
    transformers builds from it, then read as a ``config.json`` is (the multi-token-prediction block, counted in
    ``block_count``, is not a decoder layer; the value dim is stated whole, the rotary width in dims; Qwen3-Next's rope
    has no sections, and its experts are on every layer, renormalised, as llama.cpp reads them)."""
    arch = str(fields.get("general.architecture"))
    f = GGUFFields(fields, arch)
    head_dim, value_heads = int(f.key("attention.key_length")), int(f.key("ssm.time_step_rank"))
    eos, bos = fields.get("tokenizer.ggml.eos_token_id"), fields.get("tokenizer.ggml.bos_token_id")
    text: dict[str, Any] = {
        "model_type": _GGUF_TEXT_TYPES[arch], "vocab_size": gguf_base_fields(fields, arch)["vocab_size"],
        "max_position_embeddings": int(f.key("context_length")), "hidden_size": int(f.key("embedding_length")),
        "num_attention_heads": int(f.key("attention.head_count")),
        "num_key_value_heads": int(f.key("attention.head_count_kv")), "head_dim": head_dim,
        "rms_norm_eps": float(f.key("attention.layer_norm_rms_epsilon")),
        "full_attention_interval": int(f.key("full_attention_interval")),
        "linear_conv_kernel_dim": int(f.key("ssm.conv_kernel")), "linear_key_head_dim": int(f.key("ssm.state_size")),
        "linear_num_key_heads": int(f.key("ssm.group_count")), "linear_num_value_heads": value_heads,
        "linear_value_head_dim": int(f.key("ssm.inner_size")) // value_heads,
        "num_hidden_layers": int(f.key("block_count")) - int(f.get("nextn_predict_layers") or 0),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(f.key("rope.freq_base")),
                            "partial_rotary_factor": int(f.key("rope.dimension_count")) / head_dim,
                            **hf_rope_parameters(gguf_rope(f))},  # a long-context release's yarn
        "tie_word_embeddings": True,  # decided by the loader from the tensors present
        "eos_token_id": None if eos is None else int(eos), "bos_token_id": None if bos is None else int(bos),
    }
    if arch != GGUF_NEXT:
        text["rope_parameters"].update(mrope_section=[s for s in f.get("rope.dimension_sections") or () if s],
                                       mrope_interleaved=True)
    if f.get("feed_forward_length"):
        text["intermediate_size"] = int(f.get("feed_forward_length"))
    if arch in (GGUF_MOE, GGUF_NEXT):
        text.update(num_experts=int(f.key("expert_count")), num_experts_per_tok=int(f.key("expert_used_count")),
                    moe_intermediate_size=int(f.key("expert_feed_forward_length")),
                    shared_expert_intermediate_size=int(f.key("expert_shared_feed_forward_length")))
    if arch == GGUF_NEXT:
        text.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    return hybrid_config(text, "qwen3_next" if arch == GGUF_NEXT else ARCHITECTURE)


def qwen3_5_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model; None for the vision tower's and the multi-token-prediction
    layers' (not read)."""
    if name.startswith(_SKIPPED):
        return None
    if name.startswith("model.language_model."):
        return "model." + name.removeprefix("model.language_model.")
    return name
