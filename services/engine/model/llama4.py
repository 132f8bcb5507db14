"""Llama 4 (Meta: Scout 17B-16E, Maverick 17B-128E): Llama's decoder with interleaved (complex) rope and llama3
scaling, no rope on every fourth layer (``no_rope_layers``), experts with a shared expert (on every layer, or every
other: ``interleave_moe_layer_step``), served by :mod:`services.engine.model.llama4_decoder`.

What the layers add (:class:`Llama4Attention`): the rotated layers' q and k are L2-normed after rope (``use_qk_norm``,
no weight); the unrotated layers' queries are scaled by ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))``
(``attn_temperature_tuning``); the router takes each token's top-k logits, and the experts take the token *scaled
by* the sigmoid of its logit (not their output weighted), beside a shared expert every token goes through.

The rotated layers (``layer_types``' ``chunked_attention``) attend within chunks of ``attention_chunk_size`` (8192):
a query sees the keys of its own chunk only (``ModelConfig.attention_chunk``, served by
:mod:`kernels.attention.chunked`); the unrotated layers see the whole context.

Both checkpoints are read: ``Llama4ForCausalLM`` (``llama4_text``) and ``Llama4ForConditionalGeneration``
(``llama4``: every release), whose vision model and projector are never read (:func:`llama4_tensor_name`); and
llama.cpp's ``llama4`` GGUF files (:func:`config_from_gguf`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.multimodal_text import VISION_PREFIXES, text_config, text_tensor_name

ARCHITECTURE = "llama4"
GGUF_ARCHITECTURE = "llama4"
# llama.cpp's own constants for a file with chunked layers (fixed in its code, not in the file): the chunk, the query
# temperature's floor and scale, no rope on every fourth layer; q/k norms on all but the 128-expert model (Maverick)
LLAMA_CPP_CHUNK, LLAMA_CPP_TEMPERATURE, LLAMA_CPP_NOPE_STEP, LLAMA_CPP_NO_QK_NORM_EXPERTS = 8192, 0.1, 4, 128
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
    chunked = tuple(i for i, kind in enumerate(text["layer_types"][:layers]) if kind == "chunked_attention")
    chunk = text.get("attention_chunk_size")
    if chunked and not chunk:
        raise ModelLoadError("llama4: layer_types has chunked_attention layers but attention_chunk_size is null")
    if chunked and int(chunk) >= fields["max_position"]:  # a chunk the context never outgrows hides nothing
        chunked = ()
    experts = int(text["num_local_experts"])
    moe = MoEConfig(num_experts=experts, top_k=int(text["num_experts_per_tok"]),
                    intermediate_size=int(text["intermediate_size"]), norm_topk_prob=False,
                    sparse_layers=tuple(int(i) for i in text["moe_layers"]),
                    shared_expert_intermediate_size=int(text["intermediate_size"]), shared_expert_gated=False,
                    stacked_input_major=True, sigmoid_after_topk=True, weights_scale_inputs=True)
    return ModelConfig(
        **fields | {"intermediate_size": int(text["intermediate_size_mlp"])}, moe=moe,
        nope_layers=tuple(i for i, r in enumerate(rotated) if not r), rope_interleaved=True,
        attention_chunk=int(chunk) if chunked else None, chunked_layers=chunked,
        llama4=Llama4Attention(
            qk_l2_norm=bool(text.get("use_qk_norm")),
            temperature_scale=float(text["attn_scale"]) if text.get("attn_temperature_tuning") else 0.0,
            temperature_floor=int(text["floor_scale"])),
    )


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``llama4`` file's config, read as its loader reads it: chunked layers with llama.cpp's own
    constants (:data:`LLAMA_CPP_CHUNK` …, chunked on every layer but each fourth, as its
    ``attention.sliding_window_pattern`` places them; a sliding window of 0 is refused by name); experts on every
    ``interleave_moe_layer_step``-th layer, each and the shared one ``expert_feed_forward_length`` wide, the dense
    layers ``feed_forward_length``; q and k rows as the checkpoint's (its converter does not permute them)."""
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    experts = int(f.get("expert_count") or 0)
    if not experts:
        raise ModelLoadError("GGUF llama4: a file without experts (MobileLLM's) is not served (llama.cpp refuses it)")
    if f.get("attention.sliding_window") is not None and int(f.get("attention.sliding_window")) == 0:
        raise ModelLoadError("GGUF llama4: attention.sliding_window 0 (MobileLLM's unchunked layers) is not served "
                             "(llama.cpp's loader then has no query temperature for its last layer)")
    layers, step = base["num_layers"], int(f.key("interleave_moe_layer_step"))
    inter = int(f.key("expert_feed_forward_length"))
    moe = MoEConfig(num_experts=experts, top_k=int(f.key("expert_used_count")), intermediate_size=inter,
                    norm_topk_prob=False, sparse_layers=tuple(i for i in range(layers) if step and (i + 1) % step == 0),
                    shared_expert_intermediate_size=inter, shared_expert_gated=False, sigmoid_after_topk=True,
                    weights_scale_inputs=True)
    rotated = tuple(i for i in range(layers) if (i + 1) % LLAMA_CPP_NOPE_STEP)
    chunked = base["max_position"] > LLAMA_CPP_CHUNK  # a chunk the context never outgrows hides nothing
    return ModelConfig(
        **base | {"eos_token_ids": gguf_turn_end_ids(base, fields)}, moe=moe,
        nope_layers=tuple(i for i in range(layers) if i not in rotated), rope_interleaved=True,
        attention_chunk=LLAMA_CPP_CHUNK if chunked else None, chunked_layers=rotated if chunked else (),
        llama4=Llama4Attention(qk_l2_norm=experts != LLAMA_CPP_NO_QK_NORM_EXPERTS,
                               temperature_scale=LLAMA_CPP_TEMPERATURE, temperature_floor=LLAMA_CPP_CHUNK),
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
