"""GPT-OSS (gpt-oss-20b, gpt-oss-120b): the shared decoder with attention sinks, q/k/v/o biases, sliding-window
(128) and full layers alternating, yarn rope, and a mixture of experts on every layer whose router has a bias and
takes the softmax of the top-k logits, and whose experts (with biases) apply a clamped SwiGLU. Read as
transformers reads the config (its ``GptOssConfig`` defaults fill what a file omits). Published checkpoints
store the experts in MXFP4, dequantised at load (:mod:`services.engine.model.gpt_oss_decoder`).

llama.cpp's ``gpt-oss`` GGUF files (ggml-org's, Unsloth's; MXFP4 experts, dequantised to bfloat16, exact) are read
as llama.cpp reads them: the window on every other layer from the first (its ``swa`` pattern of 2, transformers'
``layer_types``), GPT-OSS's clamped SwiGLU (limit 7, alpha 1.702: fixed in llama.cpp's code, not in the file), yarn
from ``rope.scaling.*`` with GPT-OSS's unrounded correction range (``truncate: false``, as every GPT-OSS config says),
and the harmony turn ends (``<|return|>``, ``<|call|>``, ``<|endoftext|>``) as EOS ids."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "gpt_oss"
GGUF_ARCHITECTURE = "gpt-oss"
# GptOssConfig's, which llama.cpp's gpt-oss graph fixes in its code
SWIGLU_LIMIT, SWIGLU_ALPHA = 7.0, 1.702
SUPPORTED_QUANTIZATION = "mxfp4"  # the experts only, as OpenAI's checkpoints hold them


def _full_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    from transformers import GptOssConfig

    quantization = cfg.get("quantization_config") or {}
    if quantization and quantization.get("quant_method") != SUPPORTED_QUANTIZATION:
        raise ModelLoadError(f"gpt_oss: quantization {quantization.get('quant_method')!r} is not supported (only "
                             f"{SUPPORTED_QUANTIZATION!r}, dequantised at load)")
    return with_defaults(ARCHITECTURE, GptOssConfig, cfg)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    full = _full_config(cfg)
    fields = base_fields(full, ARCHITECTURE, check_mlp=False)  # the experts' activation is GPT-OSS's own
    layers, window = fields["num_layers"], full.get("sliding_window")
    windows = typed_layer_windows(ARCHITECTURE, list(full["layer_types"]), layers, int(window or 0))
    # no window, or one the context never outgrows: every layer full (ModelConfig.served_within drops the latter)
    windows = windows if window is not None and int(window) < fields["max_position"] else ()
    moe = MoEConfig(num_experts=int(full["num_local_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=fields["intermediate_size"], norm_topk_prob=False,
                    sparse_layers=tuple(range(layers)), softmax_after_topk=True,
                    swiglu_limit=float(full["swiglu_limit"]), swiglu_alpha=float(full["swiglu_alpha"]))
    bias = bool(full.get("attention_bias", True))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, moe=moe,
                       layer_windows=windows if any(w is not None for w in windows) else (), attention_sinks=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``gpt-oss`` file's config (see the module)."""
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    layers, window = base["num_layers"], f.get("attention.sliding_window")
    scaling = base["rope_scaling"]
    if scaling is not None and scaling.rope_type == "yarn":
        scaling = dataclasses.replace(scaling, truncate=False)
    windows = tuple(int(window) if i % 2 == 0 else None for i in range(layers)) if window else ()
    moe = MoEConfig(num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
                    intermediate_size=int(f.get("expert_feed_forward_length") or base["intermediate_size"]),
                    norm_topk_prob=False, sparse_layers=tuple(range(layers)), softmax_after_topk=True,
                    swiglu_limit=SWIGLU_LIMIT, swiglu_alpha=SWIGLU_ALPHA)
    fields_out = {**base, "architecture": ARCHITECTURE, "rope_scaling": scaling,
                  "intermediate_size": moe.intermediate_size, "eos_token_ids": gguf_turn_end_ids(base, fields)}
    return ModelConfig(**fields_out, qkv_bias=True, o_bias=True, moe=moe, layer_windows=windows,
                       attention_sinks=True)
