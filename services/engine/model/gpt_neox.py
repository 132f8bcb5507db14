"""EleutherAI's GPT-NeoX (GPT-NeoX-20B, the Pythia suite, and their kin: RedPajama-INCITE, Dolly v2, rinna's Japanese
GPT-NeoX; ``GPTNeoXForCausalLM``, ``gpt_neox``): LayerNorms with biases
(:mod:`services.engine.model.layernorm_decoder`), attention and an ungated GELU MLP
(``dense_h_to_4h``/``dense_4h_to_h``, exact GELU or its tanh form) side by side each on its own norm
(``use_parallel_residual``: ``parallel_mlp_norm``) or one after the other, biases on every projection, rope on the
leading ``rotary_pct`` of each head (``rotary_emb_base`` its base), an untied head (``embed_out``).

q, k and v are stored fused and interleaved head by head (``[heads, 3, head_dim]`` rows); the decoder
(:class:`services.engine.model.gpt_neox_decoder.GPTNeoXDecoderModel`) regroups them as q, k, v. ``config.json`` is
completed with ``GPTNeoXConfig``'s defaults; another ``hidden_act`` is refused by name.

llama.cpp's ``gptneox`` GGUF files (:func:`config_from_gguf`): its converter regroups q/k/v (``attn_qkv``, q rows then
k then v), writes ``use_parallel_residual``, the LayerNorms' epsilon and the rotated part (``rope.dimension_count``),
no rope base (10000, as every release has) and no activation: the exact GELU is read, as the checkpoints run it
(llama.cpp computes its tanh approximation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_layer_norm_fields
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = "gpt_neox"
GGUF_ARCHITECTURE = "gptneox"
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

# transformers 4's saved causal-mask buffers (Pythia's, GPT-NeoX-20B's files hold them); transformers drops them
_MASK_BUFFERS = re.compile(r"\.attention\.(bias|masked_bias)$")
_NAMES = renames(((r"^gpt_neox\.embed_in\.", "model.embed_tokens."), (r"^gpt_neox\.final_layer_norm\.", "model.norm."),
                  (r"^gpt_neox\.layers\.", "model.layers."), (r"^embed_out\.", "lm_head."),
                  (r"\.attention\.query_key_value\.", ".self_attn.query_key_value."),
                  (r"\.attention\.dense\.", ".self_attn.o_proj."), (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
                  (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj.")))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import GPTNeoXConfig

    full = with_defaults(ARCHITECTURE, GPTNeoXConfig, cfg)
    activation = _ACTIVATIONS.get(str(full.get("hidden_act")))
    if activation is None:
        raise ModelLoadError(f"{ARCHITECTURE}: hidden_act {full.get('hidden_act')!r} is not supported (only "
                             f"{', '.join(_ACTIVATIONS)})")
    bias = bool(full.get("attention_bias", True))
    parallel = bool(full.get("use_parallel_residual", True))
    # every head its own KV; the head hidden / heads whatever head_dim says (transformers' attention takes no other)
    fields = base_fields({**full, "rms_norm_eps": full["layer_norm_eps"], "head_dim": None,
                          "num_key_value_heads": full["num_attention_heads"]}, ARCHITECTURE, check_mlp=False,
                         partial_rotary=True)
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, mlp_bias=True, mlp_activation=activation,
                       layer_norm=True, parallel_blocks=parallel, parallel_mlp_norm=parallel)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    parallel = bool(GGUFFields(fields, GGUF_ARCHITECTURE).get("use_parallel_residual", True))
    return ModelConfig(**{**gguf_layer_norm_fields(fields, GGUF_ARCHITECTURE), "architecture": ARCHITECTURE},
                       qkv_bias=True, o_bias=True, mlp_bias=True, mlp_activation="gelu", layer_norm=True,
                       parallel_blocks=parallel, parallel_mlp_norm=parallel)


def gpt_neox_tensor_name(name: str) -> str | None:
    """A GPT-NeoX checkpoint tensor's name in the decoder (its fused q/k/v kept apart, as ``query_key_value``, for
    the decoder to regroup); None for the causal-mask buffers older checkpoints saved (not read, as transformers
    drops them)."""
    return None if _MASK_BUFFERS.search(name) else renamed(name, _NAMES)
