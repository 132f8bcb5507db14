"""TII Falcon-H1 (0.5B … 34B, Falcon-H1R, Falcon-H1-Tiny; ``FalconH1ForCausalLM``, ``falcon_h1``): a parallel hybrid.
Every layer runs a Mamba-2 mixer and attention side by side on its normed input and adds both to the residual
stream (so every layer keeps KV and a recurrent state: ``Mamba2.beside_attention``), then a SwiGLU MLP; muP
multipliers throughout (:class:`FalconH1Scales`), served by :mod:`services.engine.model.falcon_h1_decoder`.

Of the scalars, the embedding's and the LM head's are Granite's (``Multipliers.embedding``, ``logits_scale``) and the
key's joins the attention scale (``q · (m k) · d**-0.5 = q · k · (m d**-0.5)``: the cache holds k unscaled). The
step sizes are floored at ``time_step_limit``'s lower bound; a finite upper bound, ``mamba_proj_bias`` and
``projectors_bias`` (none in the releases) are refused. ``config.json`` is completed with ``FalconH1Config``'s
defaults (``mamba_d_ssm`` the mixer's width, or ``mamba_expand`` × hidden). Its tensors are named as Bamba's
(:func:`services.engine.model.bamba.bamba_tensor_name`).

llama.cpp's ``falcon-h1`` GGUF files (:func:`config_from_gguf`): its converter folds every multiplier into the
weights (the embedding's and the head's, the key's and ``attention_in`` into q/k/v, ``attention_out`` into o, the
MLP's into gate and down, ``ssm_in`` and the five section scales into the mixer's projection rows, ``ssm_out`` into
its output), so a file is served with every scale 1; q and k are not permuted (its rope rotates the halves, NEOX's);
the mixer's norm is read where the file holds ``ssm_norm`` and runs after the gate, as llama.cpp runs it. A file of a
tied model (no ``output`` tensor) takes its head from the embedding, the embedding's multiplier folded in, as
llama.cpp serves it (transformers multiplies the logits by ``lm_head_multiplier`` instead).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import Mamba2, ModelConfig, Multipliers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields
from services.engine.model.granite_hybrid import gguf_mamba
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "falcon_h1"
GGUF_ARCHITECTURE = "falcon-h1"


@dataclass(frozen=True)
class FalconH1Scales:
    """Falcon-H1's muP multipliers and its mixer's norm. Per layer, on the normed input ``x``:
    ``h += ssm_out · mamba(ssm_in · x) + attention_out · attention(attention_in · x)``, then
    ``h += mlp_down · down(silu(mlp_gate · gate(x')) · up(x'))``. The Mamba-2 projection's rows are multiplied by
    ``ssm`` section by section (z, x, B, C, dt: transformers' ``mup_vector``); its output is gated by ``silu(z)``
    with no norm, or (``mamba_norm``) RMS-normed per group before the gate (``norm_before_gate``) or after it."""

    attention_in: float = 1.0
    attention_out: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    mlp_gate: float = 1.0
    mlp_down: float = 1.0
    mamba_norm: bool = False
    norm_before_gate: bool = True


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import FalconH1Config

    full = with_defaults(ARCHITECTURE, FalconH1Config, cfg)
    for key in ("mamba_proj_bias", "projectors_bias", "attention_bias"):
        if full.get(key):
            raise ModelLoadError(f"{ARCHITECTURE}: {key} is not supported (no release has it)")
    limit = tuple(full.get("time_step_limit") or (0.0, float("inf")))
    if len(limit) != 2 or limit[1] != float("inf"):
        raise ModelLoadError(f"{ARCHITECTURE}: time_step_limit {list(limit)} is not supported (only an upper bound of "
                             "infinity)")
    ssm, mlp = tuple(float(m) for m in full["ssm_multipliers"]), tuple(float(m) for m in full["mlp_multipliers"])
    if len(ssm) != 5 or len(mlp) != 2:
        raise ModelLoadError(f"{ARCHITECTURE}: ssm_multipliers must hold 5 (z, x, B, C, dt) and mlp_multipliers 2 "
                             f"(gate, down); got {list(ssm)}, {list(mlp)}")
    fields = base_fields(full, ARCHITECTURE)
    layers = fields["num_layers"]
    intermediate = int(full.get("mamba_d_ssm") or int(full["mamba_expand"]) * fields["hidden_size"])
    mamba = Mamba2(layers=tuple(range(layers)), heads=int(full["mamba_n_heads"]), head_dim=int(full["mamba_d_head"]),
                   state_size=int(full["mamba_d_state"]), groups=int(full["mamba_n_groups"]),
                   conv_kernel=int(full["mamba_d_conv"]), conv_bias=bool(full.get("mamba_conv_bias", True)),
                   dt_min=float(limit[0]), beside_attention=True)
    if mamba.intermediate != intermediate:
        raise ModelLoadError(f"{ARCHITECTURE}: mamba_n_heads × mamba_d_head ({mamba.intermediate}) must be the "
                             f"mixer's width {intermediate} (mamba_d_ssm, or mamba_expand × hidden_size)")
    scales = FalconH1Scales(
        attention_in=float(full["attention_in_multiplier"]), attention_out=float(full["attention_out_multiplier"]),
        ssm_in=float(full["ssm_in_multiplier"]), ssm_out=float(full["ssm_out_multiplier"]),
        ssm=ssm, mlp_gate=mlp[0], mlp_down=mlp[1],  # type: ignore[arg-type]
        mamba_norm=bool(full["mamba_rms_norm"]), norm_before_gate=bool(full["mamba_norm_before_gate"]))
    multipliers = Multipliers(embedding=float(full["embedding_multiplier"]),
                              attention=float(full["key_multiplier"]) * fields["head_dim"] ** -0.5,
                              logits_scale=float(full["lm_head_multiplier"]))
    return dataclasses.replace(ModelConfig(**fields), mamba=mamba, falcon_h1=scales, multipliers=multipliers)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    mamba = gguf_mamba(f, tuple(range(base["num_layers"])))
    assert mamba is not None
    scales = FalconH1Scales(mamba_norm=f.has_tensor(".ssm_norm.weight"), norm_before_gate=False)
    return ModelConfig(**{**base, "architecture": ARCHITECTURE},
                       mamba=dataclasses.replace(mamba, beside_attention=True), falcon_h1=scales,
                       multipliers=Multipliers())
