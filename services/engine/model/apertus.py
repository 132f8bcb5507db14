"""Swiss AI's Apertus (8B, 70B; ``ApertusForCausalLM``, ``apertus``): Llama's layer with per-head q/k RMSNorms before
rope and an ungated MLP ``down(xielu(up(x)))`` whose xIELU activation has each layer's learned parameters
(``mlp.act_fn.alpha_p``/``alpha_n``/``beta``/``eps``; ``ModelConfig.mlp_activation``); its norms are named
``attention_layernorm`` and ``feedforward_layernorm``. ``config.json`` is completed with transformers'
``ApertusConfig``; another ``hidden_act`` is refused by name.

Apertus 1.5 (``apertus1p5``, ``Apertus1p5ForConditionalGeneration``, and its text model ``apertus1p5_text``): the
same layer over a vocabulary extended with image and audio codes, whose LM head may keep only the text ids
(``output_vocab_size``: ``ModelConfig.output_vocab_size``, the others never sampled); its image and audio tokenizers
are not read (text in, text out)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.model.arcee import ungated_mlp_config
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import with_defaults
from services.engine.model.multimodal_text import text_config, text_tensor_name

ARCHITECTURE = "apertus"
APERTUS_1P5 = ("apertus1p5", "apertus1p5_text")  # (the multimodal checkpoint, its text model)
_TOKENIZERS = ("model.vision_tokenizer.", "model.audio_tokenizer.")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Apertus1p5TextConfig, ApertusConfig

    if cfg.get("model_type") not in APERTUS_1P5:
        return ungated_mlp_config(with_defaults(ARCHITECTURE, ApertusConfig, cfg), ARCHITECTURE, "xielu", qk_norm=True)
    text = {**text_config(cfg, APERTUS_1P5[0]), "model_type": APERTUS_1P5[1]}
    full = with_defaults(APERTUS_1P5[1], Apertus1p5TextConfig, text)
    config = ungated_mlp_config(full, ARCHITECTURE, "xielu", qk_norm=True)
    pruned = full.get("output_vocab_size")
    return config if pruned is None else dataclasses.replace(config, output_vocab_size=int(pruned))


def apertus_tensor_name(name: str) -> str | None:
    """An Apertus checkpoint tensor's name in the shared decoder (its norms under Llama's names; Apertus 1.5's text
    model's, its image and audio tokenizers not read)."""
    text = None if name.startswith(_TOKENIZERS) else text_tensor_name(name)
    if text is None:
        return None
    return text.replace(".attention_layernorm.", ".input_layernorm.").replace(
        ".feedforward_layernorm.", ".post_attention_layernorm.")
