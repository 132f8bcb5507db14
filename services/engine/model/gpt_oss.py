"""GPT-OSS (gpt-oss-20b, gpt-oss-120b): the shared decoder with attention sinks, q/k/v/o biases, sliding-window
(128) and full layers alternating, yarn rope, and a mixture of experts on every layer whose router has a bias and
takes the softmax of the top-k logits, and whose experts (with biases) apply a clamped SwiGLU. Read as
transformers reads the config (its ``GptOssConfig`` defaults fill what a file omits). Published checkpoints
store the experts in MXFP4, dequantised at load (:mod:`services.engine.model.gpt_oss_decoder`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "gpt_oss"
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
    # no window, or one the context never outgrows: every layer full (ModelConfig.windows_within drops the latter)
    windows = windows if window is not None and int(window) < fields["max_position"] else ()
    moe = MoEConfig(num_experts=int(full["num_local_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=fields["intermediate_size"], norm_topk_prob=False,
                    sparse_layers=tuple(range(layers)), softmax_after_topk=True,
                    swiglu_limit=float(full["swiglu_limit"]), swiglu_alpha=float(full["swiglu_alpha"]))
    bias = bool(full.get("attention_bias", True))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, moe=moe,
                       layer_windows=windows if any(w is not None for w in windows) else (), attention_sinks=True)
