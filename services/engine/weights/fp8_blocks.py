"""Checkpoints whose linear weights are FP8 (``quantization_config`` ``quant_method: fp8``): with a scale per block
(``weight_block_size``: DeepSeek-V3/V3.1/R1's, Kimi K2's and MiniMax-M2's own files, the Qwen3 ``-FP8`` releases)
or one per tensor (``weight_block_size`` null: Ministral 3's and Devstral 2's). Each ``X.weight`` (float8 e4m3) and
its ``X.weight_scale_inv`` (one scale per block of ``weight_block_size``, float32 or E8M0; or one scale) are folded
at load into one bfloat16 weight, ``weight * scale`` of its block, as transformers' fine-grained FP8 loader does
with ``dequantize=True``; a block cut short by the edge of the matrix takes its block's scale (DeepSeek's
``weight_dequant``). The tensors the checkpoint leaves unquantized (embeddings, norms, the head, routers) are read
as stored. Static activation scales (``activation_scheme: static``: an ``X.activation_scale`` per weight) are
dropped, as transformers' dequantising load drops them: activations stay bf16.

What that serves: the checkpoint's weights exactly, in bf16 (twice the FP8 weights' memory; bit for bit as
transformers' bf16 load, and a float32 engine computes on those bf16 values), with activations in bf16; vLLM and
SGLang run FP8 GEMMs on the FP8 weights instead (and quantize activations, ``activation_scheme: dynamic``), which
is faster on Hopper and not bit-equal to either. compressed-tensors checkpoints are read by
:mod:`compressed_checkpoint`; other ``quant_method``s (AWQ, GPTQ, bitsandbytes) are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from services.engine.errors import ModelLoadError

SCALE_SUFFIX = "_scale_inv"
ACTIVATION_SCALE_SUFFIX = ".activation_scale"
OWN_QUANTIZATION = ("mxfp4",)  # read by its family (GPT-OSS's experts)
COMPRESSED_TENSORS = "compressed-tensors"  # read by compressed_checkpoint
FP8_DTYPES = (torch.float8_e4m3fn,)
DEQUANTIZED_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Fp8Scheme:
    """How an FP8 checkpoint's weights are scaled: per ``block`` (rows, cols), or per tensor (None)."""

    block: tuple[int, int] | None


def checkpoint_quantization(hf_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A ``config.json``'s ``quantization_config`` ({}: none): at its top level, or a wrapper's in its text model's
    config, where Kimi K2.5's and K2.6's releases write it."""
    text = hf_config.get("text_config")
    return hf_config.get("quantization_config") or (isinstance(text, Mapping) and text.get("quantization_config")) \
        or {}


def fp8_scheme(hf_config: Mapping[str, Any]) -> Fp8Scheme | None:
    """The scheme of an FP8 checkpoint (None: not one); one this loader cannot serve exactly is refused naming what
    it has."""
    quantization = checkpoint_quantization(hf_config)
    method = quantization.get("quant_method")
    if method in (None, *OWN_QUANTIZATION, COMPRESSED_TENSORS):
        return None
    if method != "fp8":
        raise ModelLoadError(f"quantization {method!r} is not supported ('fp8' and 'compressed-tensors' checkpoints "
                             "are dequantised at load; GGUF files carry their own 4-bit weights)")
    if quantization.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
        raise ModelLoadError(f"fp8 checkpoint with activation_scheme {quantization['activation_scheme']!r} is not "
                             "supported (only 'dynamic' or 'static'; activations stay bf16)")
    if quantization.get("fmt", "e4m3") not in ("e4m3", "float8_e4m3fn"):  # DeepSeek's spelling, MiniMax's
        raise ModelLoadError(f"fp8 checkpoint of fmt {quantization['fmt']!r} is not supported (only 'e4m3')")
    block = quantization.get("weight_block_size")
    if block is None:
        return Fp8Scheme(None)
    if not isinstance(block, list | tuple) or len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ModelLoadError(f"fp8 checkpoint with a weight_block_size of {block!r}: two sizes > 0 (or null, one "
                             "scale per tensor) are served")
    return Fp8Scheme((int(block[0]), int(block[1])))


def dequantize_fp8(tensors: dict[str, torch.Tensor], scheme: Fp8Scheme) -> None:
    """Replace, in ``tensors``, each FP8 weight and its ``_scale_inv`` by the bf16 weight they encode, and drop the
    static activation scales; an FP8 tensor without its scale, or a scale without its weight, is refused naming
    it."""
    for name in [name for name in tensors if name.endswith(ACTIVATION_SCALE_SUFFIX)]:
        del tensors[name]
    for scale_name in [name for name in tensors if name.endswith(SCALE_SUFFIX)]:
        name = scale_name.removesuffix(SCALE_SUFFIX)
        if name not in tensors:
            raise ModelLoadError(f"fp8 checkpoint: scale {scale_name!r} has no weight {name!r}")
        scale = tensors.pop(scale_name)
        tensors[name] = dequantize_weight(name, tensors[name], scale, scheme.block) if scheme.block is not None \
            else dequantize_per_tensor(name, tensors[name], scale)
    unscaled = sorted(name for name, tensor in tensors.items() if tensor.dtype in FP8_DTYPES)
    if unscaled:
        raise ModelLoadError(f"fp8 checkpoint: tensor {unscaled[0]!r} is FP8 without its {SCALE_SUFFIX!r}")


def dequantize_per_tensor(name: str, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``weight`` (FP8) times its one scale, in bf16."""
    _check_fp8_matrix(name, weight)
    if scale.numel() != 1:
        raise ModelLoadError(f"fp8 checkpoint: the scale of {name!r} is {tuple(scale.shape)}; a checkpoint without "
                             "weight_block_size has one scale per tensor")
    return (weight.float() * scale.float().reshape(())).to(DEQUANTIZED_DTYPE)


def _check_fp8_matrix(name: str, weight: torch.Tensor) -> None:
    if weight.dtype not in FP8_DTYPES or weight.dim() < 2:
        raise ModelLoadError(f"fp8 checkpoint: {name!r} has a scale but is a {weight.dim()}-d {weight.dtype} tensor, "
                             "not a float8_e4m3fn matrix")


def dequantize_weight(name: str, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``weight`` (``[..., rows, cols]`` FP8) times the scale of its block (``scale``: ``[..., ceil(rows / b0),
    ceil(cols / b1)]``), in bf16."""
    _check_fp8_matrix(name, weight)
    rows, cols = weight.shape[-2:]
    grid = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale.shape) != (*weight.shape[:-2], *grid):
        raise ModelLoadError(f"fp8 checkpoint: the scale of {name!r} is {tuple(scale.shape)}; its "
                             f"{tuple(weight.shape)} weight in blocks of {block} needs {(*weight.shape[:-2], *grid)}")
    factors = (scale.float() - 127.0).exp2() if scale.dtype == torch.uint8 else scale.float()  # uint8: E8M0 bytes
    factors = factors.repeat_interleave(block[0], dim=-2)[..., :rows, :]
    factors = factors.repeat_interleave(block[1], dim=-1)[..., :cols]
    return (weight.float() * factors).to(DEQUANTIZED_DTYPE)
