"""The text model of a vision-language checkpoint (a ``*ForConditionalGeneration``: Gemma 3's 4B/12B/27B,
Mistral Small 3.x, Ministral 3): its ``text_config`` and its tensors. The vision tower and the projector are
never read; the prompt is text only.

Two layouts of tensor names exist: the first releases' (``language_model.model.*``, ``language_model.lm_head.*``,
``vision_tower.*``, ``multi_modal_projector.*``) and transformers 5's (``model.language_model.*``, ``lm_head.*``,
``model.vision_tower.*``, ``model.multi_modal_projector.*``); both map to the text model's own
(``model.layers.…``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_INHERITED = ("eos_token_id", "bos_token_id", "tie_word_embeddings")


def text_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model (``model.layers.…``), None for the vision tower's and the
    projector's (not read). A text-only checkpoint's name is already one."""
    if name.startswith(VISION_PREFIXES):
        return None
    for prefix, replacement in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return replacement + name.removeprefix(prefix)
    return name


def text_config(cfg: Mapping[str, Any], wrapper_type: str) -> dict[str, Any]:
    """``cfg`` itself (a text-only config), or, where its ``model_type`` is ``wrapper_type``, its ``text_config``,
    with the top level's token ids and tying where the text model's lack them."""
    if cfg.get("model_type") != wrapper_type:
        return dict(cfg)
    text = dict(cfg.get("text_config") or {})
    for key in _INHERITED:
        if cfg.get(key) is not None:
            text.setdefault(key, cfg[key])
    return text
