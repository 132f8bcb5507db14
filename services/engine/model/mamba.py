"""State Spaces' Mamba (mamba-130m … 2.8b ``-hf``; ``MambaForCausalLM``, ``mamba``) and TII's Falcon-Mamba
(Falcon-Mamba-7B, Falcon3-Mamba-7B; ``falcon_mamba``): a pure state-space model, every layer one norm and one Mamba-1
mixer, no attention and no MLP (:mod:`services.engine.model.state_space_decoder`), so no KV at all
(``ModelConfig.attention_free``): each sequence keeps its layers' states alone. Falcon-Mamba RMS-norms the mixer's
step-size rows and its B and C without a weight, with ``mixer_rms_eps`` (``Mamba1.inner_norm_weights`` off).
The residual stream is float32 (``residual_in_fp32``, every release's). The released names (``backbone.*``; the
original ``backbone.embedding``) are read.

``config.json`` is completed with transformers' defaults (``time_step_rank`` "auto": ``ceil(hidden / 16)``; the
inner width ``expand`` × hidden). Nothing bounds the positions (no rope): ``max_position`` is 2**20 as llama.cpp's
converter writes, a node serving at most its ``--max-model-len``. In/out projection biases (``use_bias``: no release
has them) and another activation than SiLU are refused by name.

llama.cpp's ``mamba`` GGUF files (:func:`config_from_gguf`; Falcon-Mamba's too, which say ``ssm.dt_b_c_rms``): the
mixers from ``ssm.*`` (``time_step_rank`` the step sizes' rank; laid out by
:func:`services.engine.model.mamba_gguf.mamba_from_gguf`), ``attention.head_count`` 0 (no attention). Falcon-Mamba's
inner norms take transformers' epsilon (``mixer_rms_eps``, 1e-6 in every release), which no key carries (llama.cpp
applies the layers' 1e-5 instead). The residual stream is float32 (llama.cpp's activations are).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import Mamba1, ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields
from services.engine.model.hf_config import eos_ids, required, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = GGUF_ARCHITECTURE = "mamba"
FALCON_MAMBA = "falcon_mamba"
FALCON_MIXER_EPS = 1e-6  # Falcon-Mamba's mixer_rms_eps (transformers' default, every release's), which GGUF lacks
# no positions to bound: as long as llama.cpp's converter makes the context of a model without rope
UNBOUNDED_CONTEXT = 2**20

_RENAMES = renames([(r"^(model\.)?backbone\.", "model."), (r"^model\.lm_head\.", "lm_head."),
                    (r"^model\.embeddings?\.", "model.embed_tokens."), (r"^model\.norm_f\.", "model.norm."),
                    (r"^(model\.layers\.\d+\.)norm\.", r"\1input_layernorm."), (r"\.mixer\.", ".mamba.")])


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import FalconMambaConfig, MambaConfig

    falcon = cfg.get("model_type") == FALCON_MAMBA
    full = with_defaults(FALCON_MAMBA if falcon else ARCHITECTURE, FalconMambaConfig if falcon else MambaConfig, cfg)
    fields = state_space_fields(full, ARCHITECTURE)
    layers = tuple(range(fields["num_layers"]))
    mamba1 = Mamba1(layers=layers, inner=int(full["intermediate_size"]), state_size=int(full["state_size"]),
                    conv_kernel=int(full["conv_kernel"]), dt_rank=int(full["time_step_rank"]),
                    conv_bias=bool(full.get("use_conv_bias", True)), inner_norms=falcon, inner_norm_weights=False,
                    inner_norm_eps=float(full["mixer_rms_eps"]) if falcon else None)
    return ModelConfig(**fields, mamba1=mamba1)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_state_space_fields(fields, GGUF_ARCHITECTURE)
    falcon = bool(f.get("ssm.dt_b_c_rms", False))
    mamba1 = Mamba1(layers=tuple(range(base["num_layers"])), inner=int(f.key("ssm.inner_size")),
                    state_size=int(f.key("ssm.state_size")), conv_kernel=int(f.key("ssm.conv_kernel")),
                    dt_rank=int(f.key("ssm.time_step_rank")), conv_bias=f.has_tensor(".ssm_conv1d.bias"),
                    inner_norms=falcon, inner_norm_weights=False, inner_norm_eps=FALCON_MIXER_EPS if falcon else None)
    return ModelConfig(**base, mamba1=mamba1)


def gguf_state_space_fields(fields: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of a llama.cpp ``mamba`` or ``mamba2`` file: its ``attention.head_count`` 0
    read as :func:`state_space_fields`' placeholder head, the float32 residual stream."""
    placeholder = {f"{arch}.attention.head_count": 1, f"{arch}.attention.head_count_kv": 1,
                   f"{arch}.attention.key_length": 2}
    base = gguf_base_fields({**fields, **placeholder}, arch)
    return base | {"intermediate_size": base["hidden_size"], "residual_in_float32": True, "mixer_only": True}


def state_space_fields(full: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields a Mamba or Mamba-2 ``config.json`` (completed) gives: no attention (one
    placeholder head that no layer reads), the residual stream's precision, ``layer_norm_epsilon`` for the norms."""
    model_type = full.get("model_type") or architecture
    if full.get("use_bias"):
        raise ModelLoadError(f"{model_type}: use_bias is not supported (no release has in/out projection biases)")
    if full.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{model_type}: hidden_act {full.get('hidden_act')!r} is not supported (only 'silu')")
    hidden = int(required(full, "hidden_size"))
    return dict(
        architecture=architecture, name=str(full.get("_name_or_path") or model_type),
        vocab_size=int(required(full, "vocab_size")), hidden_size=hidden, intermediate_size=hidden,
        num_layers=int(required(full, "num_hidden_layers")), num_heads=1, num_kv_heads=1, head_dim=2,
        rope_theta=10000.0, rms_norm_eps=float(full.get("layer_norm_epsilon", 1e-5)), max_position=UNBOUNDED_CONTEXT,
        tie_word_embeddings=bool(full.get("tie_word_embeddings", False)),
        bos_token_id=None if full.get("bos_token_id") is None else int(full["bos_token_id"]),
        eos_token_ids=eos_ids(full.get("eos_token_id")),
        residual_in_float32=bool(full.get("residual_in_fp32", True)), mixer_only=True,
    )


def state_space_tensor_name(name: str) -> str:
    """A Mamba, Falcon-Mamba or Mamba-2 checkpoint tensor's name in the decoder (``backbone.`` read as ``model.``,
    Mamba-Codestral's ``model.backbone.`` too; each layer's norm as its input norm, its mixer as ``mamba``)."""
    return renamed(name, _RENAMES)
