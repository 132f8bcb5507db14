"""NVIDIA Nemotron-H (Nemotron-H 4B/8B/47B/56B, NVIDIA-Nemotron-Nano-9B/12B-v2; ``nemotron_h``): a stack of blocks,
each one norm and one mixer (:mod:`services.engine.model.nemotron_h_decoder`): Mamba-2 (``M`` in its
``hybrid_override_pattern``), attention without rope (``*``) or a squared-ReLU MLP (``-``). Its MoE blocks (``E``,
Nemotron 3) and multi-token-prediction layers are not served: the former refused by name, the latter not read.

The step sizes are floored at ``time_step_limit``'s lower bound (0 in the releases), as vLLM, TensorRT-LLM and
NVIDIA's own CUDA path do; transformers' torch fallback floors its full-sequence path (not its decode step) at
``time_step_min`` (0.001) instead, which a step size of a trained model rarely comes near.

llama.cpp's ``nemotron_h`` GGUF files (:func:`config_from_gguf`): a block's kind from its entries of the per-layer
``attention.head_count_kv`` and ``feed_forward_length`` arrays (both 0: Mamba-2; a width: the MLP; else attention), the
Mamba-2 mixers from ``ssm.*`` (laid out by :mod:`services.engine.model.mamba_gguf`), no rope anywhere, no step floor
(llama.cpp clamps none: the releases' floor is 0). Its ``nemotron_h_moe`` files (Nemotron 3) are refused by name as
their checkpoints are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import Mamba2, ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids, per_layer
from services.engine.model.granite_hybrid import gguf_mamba
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = GGUF_ARCHITECTURE = "nemotron_h"
_KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention", "attention": "attention",
          "mlp": "mlp"}


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import NemotronHConfig

    full = with_defaults(ARCHITECTURE, NemotronHConfig, cfg)
    kinds = [_KINDS.get(kind, kind) for kind in full.get("layer_types") or full.get("layers_block_type") or []]
    unknown = sorted(set(kinds) - {"mamba", "attention", "mlp"})
    if unknown:
        raise ModelLoadError(f"{ARCHITECTURE}: block types {unknown} are not supported (mamba, attention, mlp)")
    for key in ("mamba_proj_bias", "use_bias", "mlp_bias", "attention_bias", "residual_in_fp32"):
        if full.get(key):
            raise ModelLoadError(f"{ARCHITECTURE}: {key} is not supported (no release has it)")
    if full.get("mlp_hidden_act", "relu2") != "relu2" or full.get("mamba_hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{ARCHITECTURE}: activations {full.get('mlp_hidden_act')!r}/"
                             f"{full.get('mamba_hidden_act')!r} are not supported (relu2, silu)")
    if full.get("sliding_window"):
        raise ModelLoadError(f"{ARCHITECTURE}: sliding_window is not supported")
    if full.get("tie_word_embeddings"):  # transformers never ties this family's head
        raise ModelLoadError(f"{ARCHITECTURE}: tie_word_embeddings is not supported (its head is its own)")
    limit = tuple(full.get("time_step_limit") or (0.0, float("inf")))
    if len(limit) != 2 or limit[1] != float("inf"):
        raise ModelLoadError(f"{ARCHITECTURE}: time_step_limit {list(limit)} is not supported (only an upper bound of "
                             "infinity)")
    layers = [i for i, kind in enumerate(kinds)]
    fields = base_fields({**full, "num_hidden_layers": len(kinds), "rms_norm_eps": full["layer_norm_epsilon"]},
                         ARCHITECTURE, check_mlp=False)
    of = {kind: tuple(i for i in layers if kinds[i] == kind) for kind in ("mamba", "attention", "mlp")}
    mamba = None if not of["mamba"] else Mamba2(
        layers=of["mamba"], heads=int(full["mamba_num_heads"]), head_dim=int(full["mamba_head_dim"]),
        state_size=int(full["ssm_state_size"]), groups=int(full["n_groups"]), conv_kernel=int(full["conv_kernel"]),
        conv_bias=bool(full.get("use_conv_bias", True)), dt_min=float(limit[0]))
    return ModelConfig(**fields, mamba=mamba, block_kinds=tuple(kinds), nope_layers=of["attention"])


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    kv_heads, widths = per_layer(f, "attention.head_count_kv"), per_layer(f, "feed_forward_length")
    layers = len(kv_heads)
    if len(set(widths) - {0}) > 1:
        raise ModelLoadError(f"GGUF {GGUF_ARCHITECTURE}: feed_forward_length must list {layers} layers of 0 or one "
                             f"width, got {widths}")
    kinds = tuple("mlp" if widths[i] else "attention" if kv_heads[i] else "mamba" for i in range(layers))
    base = gguf_base_fields({**fields, f"{GGUF_ARCHITECTURE}.feed_forward_length": max(widths)}, GGUF_ARCHITECTURE)
    of = {kind: tuple(i for i in range(layers) if kinds[i] == kind) for kind in ("mamba", "attention")}
    return ModelConfig(**{**base, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       mamba=gguf_mamba(f, of["mamba"]), block_kinds=kinds,
                       nope_layers=of["attention"])


def nemotron_h_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the model (``backbone.`` or transformers' ``model.`` prefix; the embedding and
    final norm under the shared decoder's names; each block's norm as its input norm); None for the
    multi-token-prediction layers' (not read)."""
    if name.startswith("mtp."):
        return None
    if name.startswith("backbone."):
        name = "model." + name.removeprefix("backbone.")
    renamed = {"model.embeddings.weight": "model.embed_tokens.weight", "model.norm_f.weight": "model.norm.weight"}
    if name in renamed:
        return renamed[name]
    if name.startswith("model.layers.") and name.endswith(".norm.weight") and ".mixer." not in name:
        return name.removesuffix("norm.weight") + "input_layernorm.weight"
    return name
