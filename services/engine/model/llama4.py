"""Llama 4 (Meta: Scout 17B-16E, Maverick 17B-128E): Llama's decoder with interleaved (complex) rope and llama3
scaling, no rope on every fourth layer (``no_rope_layers``), experts with a shared expert (on every layer, or every
other: ``interleave_moe_layer_step``), served by :mod:`services.engine.model.llama4_decoder`.

What the layers add (:class:`Llama4Attention`): the rotated layers' q and k are L2-normed after rope (``use_qk_norm``,
no weight); the unrotated layers' queries are scaled by ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))``
(``attn_temperature_tuning``); the router takes each token's top-k logits, and the experts take the token *scaled
by* the sigmoid of its logit (not their output weighted), beside a shared expert every token goes through.

The rotated layers attend within chunks of ``attention_chunk_size`` (8192): a query sees the keys of its own chunk
only. Below that length a chunk is the whole causal context, so the model is served exactly up to it (logged), as a
longrope model is served up to its original context; longer prompts are refused at admission.

Both checkpoints are read: ``Llama4ForCausalLM`` (``llama4_text``) and ``Llama4ForConditionalGeneration``
(``llama4``: every release), whose vision model and projector are never read (:func:`llama4_tensor_name`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.multimodal_text import VISION_PREFIXES, text_config, text_tensor_name

log = logging.getLogger(__name__)

ARCHITECTURE = "llama4"
_VISION = ("vision_model.", "model.vision_model.")


@dataclass(frozen=True)
class Llama4Attention:
    qk_l2_norm: bool  # the rotated layers' q and k are L2-normed after rope
    temperature_scale: float  # attn_scale of the unrotated layers' query temperature (0: none)
    temperature_floor: int  # floor_scale


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    text = _text_config(cfg)
    if text.get("attention_bias"):
        raise ModelLoadError("llama4: attention_bias is not supported")
    fields = base_fields(text, ARCHITECTURE)
    layers = fields["num_layers"]
    rotated = [bool(r) for r in text["no_rope_layers"]][:layers]
    if len(rotated) < layers:
        raise ModelLoadError(f"llama4: no_rope_layers lists {len(rotated)} layers, fewer than {layers}")
    chunk = text.get("attention_chunk_size")
    if "chunked_attention" in text["layer_types"] and not chunk:
        raise ModelLoadError("llama4: layer_types has chunked_attention layers but attention_chunk_size is null")
    if "chunked_attention" in text["layer_types"] and chunk and int(chunk) < fields["max_position"]:
        log.warning("llama4: serving at most %d tokens (max_position_embeddings %d): past attention_chunk_size its "
                    "rotated layers attend within chunks, which pdserve's attention does not do", int(chunk),
                    fields["max_position"])
        fields["max_position"] = int(chunk)
    experts = int(text["num_local_experts"])
    moe = MoEConfig(num_experts=experts, top_k=int(text["num_experts_per_tok"]),
                    intermediate_size=int(text["intermediate_size"]), norm_topk_prob=False,
                    sparse_layers=tuple(int(i) for i in text["moe_layers"]),
                    shared_expert_intermediate_size=int(text["intermediate_size"]), shared_expert_gated=False,
                    stacked_input_major=True)
    return ModelConfig(
        **fields | {"intermediate_size": int(text["intermediate_size_mlp"])}, moe=moe,
        nope_layers=tuple(i for i, r in enumerate(rotated) if not r), rope_interleaved=True,
        llama4=Llama4Attention(
            qk_l2_norm=bool(text.get("use_qk_norm")),
            temperature_scale=float(text["attn_scale"]) if text.get("attn_temperature_tuning") else 0.0,
            temperature_floor=int(text["floor_scale"])),
    )


def llama4_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the shared decoder (``model.layers.{i}.mlp.…``: the router as ``mlp.gate``),
    None for the vision model's and the projector's."""
    if name.startswith(_VISION) or name.startswith(VISION_PREFIXES):
        return None
    text = text_tensor_name(name)
    assert text is not None
    return text.replace(".feed_forward.router.", ".mlp.gate.").replace(".feed_forward.", ".mlp.")


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    from transformers import Llama4TextConfig

    text = text_config(cfg, "llama4")
    text["model_type"] = "llama4_text"
    if "attn_temperature_tuning" in text:  # the releases' 4 (transformers 4.51's default), read as a flag as it was
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    return with_defaults(ARCHITECTURE, Llama4TextConfig, text)
