"""LG AI Research's EXAONE 4.0 (1.2B, 32B; ``Exaone4ForCausalLM``, ``exaone4``): OLMo 2's layer
(:class:`~services.engine.model.olmo2_decoder.Olmo2DecoderModel`: no norm before attention or the MLP, each block's
output normed before it joins the residual stream) with Qwen3's q/k norms (each head on its own, one weight for all
heads); where the config has a ``sliding_window``, the layers ``layer_types`` names ``sliding_attention`` attend
within it with rope and the others over everything without rope (the 32B's three local layers to one global); the
1.2B's layers are all global, with rope. ``config.json`` is completed with transformers' ``Exaone4Config`` defaults.
EXAONE 4.5 (``Exaone4_5_ForConditionalGeneration``, ``exaone4_5``) is a vision-language checkpoint around an EXAONE
4.0 text model (its first files name it ``exaone4_5_text``), plain positions for text: its text model is served
(:mod:`services.engine.model.multimodal_text`), its vision tower not read.

llama.cpp's ``exaone4`` GGUF files (:func:`config_from_gguf`): the same layer, nothing permuted (NEOX's rope, on
halves); a file with ``attention.sliding_window`` slides on the layers ``attention.sliding_window_pattern`` marks
(else three of every four, llama.cpp's default), the others without rope; a 64-layer file without the key is the
32B's, whose window llama.cpp takes as 4096 (every other file without it: no window, rope everywhere, the 1.2B's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, full_layers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_sliding_layers, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults
from services.engine.model.multimodal_text import text_config, text_tensor_name
from services.engine.model.tensor_renames import is_mtp_weight

ARCHITECTURE = GGUF_ARCHITECTURE = "exaone4"
EXAONE4_5 = "exaone4_5"
_GGUF_SLIDING_PERIOD = 4  # llama.cpp's pattern where a file with a window names none: the fourth layer is global
_THE_32B_S_LAYERS, _THE_32B_S_WINDOW = 64, 4096  # what llama.cpp assumes of a 64-layer file that names no window


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Exaone4Config

    text = text_config(cfg, EXAONE4_5)
    if text.get("model_type") == "exaone4_5_text":  # EXAONE 4.5's first files' name of it
        text["model_type"] = ARCHITECTURE
    full = with_defaults(ARCHITECTURE, Exaone4Config, text)
    fields = base_fields(full, ARCHITECTURE)
    return ModelConfig(**fields, qk_norm=True, **exaone4_layers(full, ARCHITECTURE, fields["num_layers"]))


def exaone4_layers(full: Mapping[str, Any], architecture: str, layers: int) -> dict[str, Any]:
    """EXAONE 4.0's attention per layer (its ``full`` config's, EXAONE MoE's too): where there is a
    ``sliding_window``, the layers ``layer_types`` names sliding attend within it with rope, the others over
    everything without (``layer_windows`` and ``nope_layers``); else every layer global, with rope."""
    window = full.get("sliding_window")
    if window is None:
        return {}
    windows = typed_layer_windows(architecture, list(full["layer_types"]), layers, window)
    return dict(layer_windows=windows, nope_layers=full_layers(windows))


def exaone4_tensor_name(name: str) -> str | None:
    """An EXAONE 4.0 or 4.5 checkpoint tensor's name in the text model (:func:`text_tensor_name`); None for the vision
    tower's and for EXAONE 4.5's multi-token-prediction weights (``mtp.*``, which transformers ignores)."""
    return None if is_mtp_weight(name) else text_tensor_name(name)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    base["eos_token_ids"] = gguf_turn_end_ids(base, fields)
    layers = base["num_layers"]
    window = int(f.get("attention.sliding_window") or (_THE_32B_S_WINDOW if layers == _THE_32B_S_LAYERS else 0))
    if not window:
        return ModelConfig(**base, qk_norm=True)
    windows = gguf_sliding_layers(f, layers, window, _GGUF_SLIDING_PERIOD)
    return ModelConfig(**base, qk_norm=True, layer_windows=windows,
                       nope_layers=full_layers(windows))
