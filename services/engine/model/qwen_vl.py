"""The text model of Qwen's vision-language checkpoints: Qwen2-VL and Qwen2.5-VL (``qwen2_vl``, ``qwen2_5_vl``:
Qwen2's decoder), Qwen3-VL (``qwen3_vl``: Qwen3's) and Qwen3-VL-MoE (``qwen3_vl_moe``: Qwen3-MoE's; its experts
stacked and stored transposed, ``moe_loading``; its top-k weights always renormalised, as its router does). The vision
tower is not read (``multimodal_text``): prompts are text.

Their multimodal rope (M-RoPE: the rotary dims split into temporal, height and width sections, each rotated by its own
position id, interleaved in Qwen3-VL) gives a text token the same id in all three, and is then the plain rope of the
same base: that is what is served. ``rope_scaling`` ``{"type": "mrope"}`` (Qwen2.5-VL's first files) reads as plain.

llama.cpp's text GGUF files of them (``qwen2vl``, ``qwen3vl``, ``qwen3vlmoe``: :func:`config_from_gguf`) are its
Qwen2, Qwen3 and Qwen3-MoE files with M-RoPE's sections and DeepStack's layer count besides (the vision tower and its
DeepStack merger live in the separate mmproj file), read as those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from services.engine.model import qwen2, qwen3, qwen3_moe
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import fields_as
from services.engine.model.multimodal_text import text_config

ARCHITECTURE = "qwen_vl"
# checkpoint type → its text family's reader, and whether the wrapper class ties by default (transformers 5)
_TEXT: dict[str, tuple[Callable[[Mapping[str, Any]], ModelConfig], bool]] = {
    "qwen2_vl": (qwen2.config_from_hf, False), "qwen2_5_vl": (qwen2.config_from_hf, False),
    "qwen3_vl": (qwen3.config_from_hf, False), "qwen3_vl_moe": (qwen3_moe.config_from_hf, True),
}
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
# llama.cpp's architecture of the text GGUF → its text family's reader and architecture
_GGUF_TEXT: dict[str, tuple[Callable[[Mapping[str, Any]], ModelConfig], str]] = {
    "qwen2vl": (qwen2.config_from_gguf, "qwen2"), "qwen3vl": (qwen3.config_from_gguf, "qwen3"),
    "qwen3vlmoe": (qwen3_moe.config_from_gguf, qwen3_moe.GGUF_ARCHITECTURE),
}
GGUF_ARCHITECTURES = tuple(_GGUF_TEXT)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """The text model of a ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl`` or ``qwen3_vl_moe`` config."""
    wrapper = str(cfg["model_type"])
    text_family, default_tie = _TEXT[wrapper]
    text = text_config(cfg, wrapper, default_tie)
    if wrapper == "qwen3_vl_moe":  # its router always renormalises the top-k (the config has no flag)
        text["norm_topk_prob"] = True
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(text.get(key), Mapping):
            text[key] = _plain_rope(text[key])
    config = text_family(text)
    if config.moe is not None:  # its files store the stacked experts transposed (moe_loading reads both)
        config = dataclasses.replace(config, moe=dataclasses.replace(config.moe, stacked_transposed=True))
    return dataclasses.replace(config, architecture=ARCHITECTURE)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A ``qwen2vl``, ``qwen3vl`` or ``qwen3vlmoe`` file's text model, its keys read as its text family's."""
    architecture = str(fields.get("general.architecture"))
    read, kin = _GGUF_TEXT[architecture]
    as_kin = {**fields_as(fields, architecture, kin), "general.architecture": kin}
    return dataclasses.replace(read(as_kin), architecture=ARCHITECTURE)


def _plain_rope(params: Mapping[str, Any]) -> dict[str, Any]:
    """M-RoPE's parameters as the plain rope a text token sees (its sections dropped; type ``mrope`` is default)."""
    plain = {k: v for k, v in params.items() if k not in _MROPE_KEYS}
    for key in ("rope_type", "type"):
        if plain.get(key) == "mrope":
            plain[key] = "default"
    return plain
