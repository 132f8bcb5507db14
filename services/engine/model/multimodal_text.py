"""The text model of a vision-language checkpoint (a ``*ForConditionalGeneration``: Gemma 3's 4B/12B/27B,
Mistral Small 3.x, Ministral 3, Qwen2.5-VL, Qwen3-VL): its ``text_config`` and its tensors. The vision tower and
the projector are never read; the prompt is text only.

Two layouts of tensor names exist: the first releases' (``language_model.model.*``, ``language_model.lm_head.*``,
``vision_tower.*``, ``multi_modal_projector.*``; Qwen2.5-VL's ``model.*`` and ``visual.*``) and transformers 5's
(``model.language_model.*``, ``lm_head.*``, ``model.vision_tower.*``, ``model.multi_modal_projector.*``,
``model.visual.*``); both map to the text model's own (``model.layers.…``).

Tying: transformers 5 reads a vision-language model's ``tie_word_embeddings`` at its top level (its class's default
where absent: true for Mistral 3, Gemma 3 and Qwen3-VL-MoE), Qwen2-VL's and Qwen2.5-VL's also from the text config
(their first files kept it there), and keeps a stored head that differs from the embeddings untied whatever the flag.
Here a wrapper is tied where the top level (or its default) or the text config says so: with the loader's own rule
(a stored head that differs stays untied, ``weights/safetensors_loader.py``) that serves every checkpoint as
transformers does, a headless one tied, whichever file the flag was written in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                   "visual.", "model.visual.", "mm_projector.", "model.mm_projector.")  # (the last: Kimi K2.5's)
_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_INHERITED = ("eos_token_id", "bos_token_id")


def text_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model (``model.layers.…``), None for the vision tower's and the
    projector's (not read). A text-only checkpoint's name is already one."""
    if name.startswith(VISION_PREFIXES):
        return None
    for prefix, replacement in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return replacement + name.removeprefix(prefix)
    return name


def text_config(cfg: Mapping[str, Any], wrapper_type: str, default_tie: bool = False) -> dict[str, Any]:
    """``cfg`` itself (a text-only config, or a wrapper's written flat, as Qwen2.5-VL's first files are), or, where
    its ``model_type`` is ``wrapper_type``, its ``text_config``, with the top level's token ids where the text
    model's lack them, tied where the top level (``default_tie``, the wrapper class's default, where it has none)
    or the text config says so (see the module)."""
    if cfg.get("model_type") != wrapper_type or not cfg.get("text_config"):
        return dict(cfg)
    text = dict(cfg["text_config"])
    for key in _INHERITED:
        if cfg.get(key) is not None:
            text.setdefault(key, cfg[key])
    top = cfg.get("tie_word_embeddings")
    text["tie_word_embeddings"] = bool(default_tie if top is None else top) or bool(text.get("tie_word_embeddings"))
    return text
