"""Which of the decoder's elementwise ops run FlashInfer's fused kernels (:mod:`kernels.fused_ops`), chosen
once at model load, before any CUDA graph is captured.

Only a CUDA model in bf16/fp16 outside the deterministic mode is eligible; every other model keeps the torch
ops bit for bit. An eligible model runs each FlashInfer op once against torch
(:func:`kernels.fused_ops_check.choose`): one that raises or disagrees stays torch's, with a warning naming it
and why; one info event lists the ops in use.
"""

from __future__ import annotations

from types import ModuleType

import structlog
import torch

from kernels.attention.flashinfer import SUPPORTED_DTYPES, import_flashinfer
from kernels.attention.registry import BackendUnavailableError
from kernels.fused_ops import FusedOps, torch_ops
from kernels.fused_ops_check import CheckShapes, choose
from kernels.rope import RotaryEmbedding
from services.engine.model.config import ModelConfig

log = structlog.get_logger(__name__)


def ineligible(device: torch.device, dtype: torch.dtype, *, enabled: bool, deterministic: bool,
               stand_in: bool) -> str:
    """Why a model cannot take FlashInfer's fused ops ("" when it can). ``stand_in``: a stand-in module was
    given for ``flashinfer`` (tests: it runs wherever the model does, CPU included)."""
    if not enabled:
        return "turned off"
    if deterministic:
        return "the deterministic mode keeps the torch ops"
    if dtype not in SUPPORTED_DTYPES:
        return f"{dtype} keeps the torch ops (FlashInfer's are bf16/fp16)"
    if device.type != "cuda" and not stand_in:
        return f"{device} is not a CUDA device"
    return ""


def check_shapes(config: ModelConfig) -> CheckShapes:
    dense = config.mlp_activation == "swiglu" and any(not config.is_sparse_layer(i) for i in range(config.num_layers))
    widths = [config.intermediate_size] if dense else []  # (an ungated MLP takes no SiLU-and-multiply)
    if config.moe is not None:
        widths.append(config.moe.intermediate_size)
    return CheckShapes(config.hidden_size, tuple(dict.fromkeys(widths)), config.num_heads, config.num_kv_heads,
                       config.head_dim, config.rms_norm_eps)


def choose_fused_ops(config: ModelConfig, rope: RotaryEmbedding, dtype: torch.dtype, device: torch.device, *,
                     enabled: bool = True, deterministic: bool = False,
                     flashinfer_module: ModuleType | None = None) -> FusedOps:
    """The model's ops: torch's, or FlashInfer's where eligible (see the module) and each passes its check.

    ``flashinfer_module``: a stand-in for ``flashinfer`` (tests run the fused path on a CPU with one)."""
    why = ineligible(device, dtype, enabled=enabled, deterministic=deterministic,
                     stand_in=flashinfer_module is not None)
    if not why and flashinfer_module is None:
        try:
            flashinfer_module = import_flashinfer()
        except BackendUnavailableError as exc:
            why = str(exc)
    if why:
        if device.type == "cuda":  # a CPU model never has them: nothing to say
            log.info("fused ops: none, torch runs every elementwise op", why=why)
        return torch_ops(rope, dtype)
    assert flashinfer_module is not None
    ops, failed = choose(flashinfer_module, rope, check_shapes(config), device, dtype)
    for name, reason in failed.items():
        log.warning("fused ops: FlashInfer's op failed its load check, torch runs it", op=name, why=reason)
    log.info("fused ops: chosen", flashinfer=list(ops.flashinfer), torch=list(failed), dtype=str(dtype))
    return ops
