"""Mistral's Mamba-Codestral-7B and State Spaces' Mamba-2 (mamba2-130m … 2.7b, in transformers' format:
``Mamba2ForCausalLM``, ``mamba2``; the original mamba_ssm checkpoints as llama.cpp's GGUF files): a pure state-space
model, every layer one norm and one Mamba-2 mixer (Granite 4.0's: the gate before the grouped norm), no attention and no
MLP (:mod:`services.engine.model.state_space_decoder`), so no KV at all (``ModelConfig.attention_free``). The residual
stream is float32 (``residual_in_fp32``); ``layer_norm_epsilon`` is every norm's. The step sizes are floored at
``time_step_limit``'s lower bound (0 as released), as Granite 4.0's and Nemotron-H's; a finite upper bound is refused.
Names, context and refusals as :mod:`services.engine.model.mamba`'s; besides, ``rms_norm`` false, a mamba_ssm-era key
transformers no longer reads, is refused (it would ask for no norm), and ``norm_before_gate`` is ignored as transformers
ignores it (Mamba-Codestral's config says true: its conversion runs, as every runtime does, the gate before the norm).

llama.cpp's ``mamba2`` GGUF files (:func:`config_from_gguf`): the mixers from ``ssm.*`` as Granite 4.0-H's
(``time_step_rank`` the heads, ``inner_size`` / heads their width, ``group_count``; laid out by
:func:`services.engine.model.mamba_gguf.mamba_from_gguf`), no step floor (llama.cpp clamps none; the releases' is 0),
the float32 residual stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import Mamba2, ModelConfig
from services.engine.model.gguf_config import GGUFFields
from services.engine.model.granite_hybrid import gguf_mamba
from services.engine.model.hf_config import with_defaults
from services.engine.model.mamba import gguf_state_space_fields, state_space_fields

ARCHITECTURE = GGUF_ARCHITECTURE = "mamba2"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Mamba2Config

    if cfg.get("rms_norm") is False:  # (norm_before_gate: transformers ignores it, Mamba-Codestral's true included)
        raise ModelLoadError(f"{ARCHITECTURE}: rms_norm false is not supported (transformers always norms the gated "
                             "output, as every release does)")
    full = with_defaults(ARCHITECTURE, Mamba2Config, cfg)
    limit = tuple(full.get("time_step_limit") or (0.0, float("inf")))
    if len(limit) != 2 or limit[1] != float("inf"):
        raise ModelLoadError(f"{ARCHITECTURE}: time_step_limit {list(limit)} is not supported (only an upper bound of "
                             "infinity)")
    fields = state_space_fields(full, ARCHITECTURE)
    mamba = Mamba2(layers=tuple(range(fields["num_layers"])), heads=int(full["num_heads"]),
                   head_dim=int(full["head_dim"]), state_size=int(full["state_size"]), groups=int(full["n_groups"]),
                   conv_kernel=int(full["conv_kernel"]), conv_bias=bool(full.get("use_conv_bias", True)),
                   dt_min=float(limit[0]))
    return ModelConfig(**fields, mamba=mamba)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    base = gguf_state_space_fields(fields, GGUF_ARCHITECTURE)
    mamba = gguf_mamba(GGUFFields(fields, GGUF_ARCHITECTURE), tuple(range(base["num_layers"])))
    return ModelConfig(**base, mamba=mamba)
