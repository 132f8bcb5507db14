"""Checkpoints whose linear weights are FP8 with a scale per block (``quantization_config`` ``quant_method: fp8``
with ``weight_block_size``): DeepSeek-V3/V3.1/R1's, Kimi K2's and MiniMax-M2's own files, the Qwen3 ``-FP8``
releases. Each ``X.weight`` (float8 e4m3) and its ``X.weight_scale_inv`` (one scale per block of
``weight_block_size``, float32 or E8M0) are folded at load into one bfloat16 weight, ``weight * scale`` of its block,
as transformers' fine-grained FP8 loader does with ``dequantize=True``; a block cut short by the edge of the matrix
takes its block's scale (DeepSeek's ``weight_dequant``). The tensors the checkpoint leaves unquantized
(embeddings, norms, the head, routers) are read as stored.

What that serves: the checkpoint's weights exactly, in bf16 (twice the FP8 weights' memory; bit for bit as
transformers' bf16 load, and a float32 engine computes on those bf16 values), with activations in bf16; vLLM and
SGLang run FP8 GEMMs on the FP8 weights instead (and quantize activations, ``activation_scheme: dynamic``), which
is faster on Hopper and not bit-equal to either. Static activation scales, per-tensor FP8 and other
``quant_method``s (AWQ, GPTQ, compressed-tensors, bitsandbytes) are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from services.engine.errors import ModelLoadError

SCALE_SUFFIX = "_scale_inv"
OWN_QUANTIZATION = ("mxfp4",)  # read by its family (GPT-OSS's experts)
FP8_DTYPES = (torch.float8_e4m3fn,)
DEQUANTIZED_DTYPE = torch.bfloat16


def fp8_block_size(hf_config: Mapping[str, Any]) -> tuple[int, int] | None:
    """The block of a block-scaled FP8 checkpoint (None: not one); one this loader cannot serve exactly is refused
    naming what it has."""
    quantization = hf_config.get("quantization_config") or {}
    method = quantization.get("quant_method")
    if method in (None, *OWN_QUANTIZATION):
        return None
    if method != "fp8":
        raise ModelLoadError(f"quantization {method!r} is not supported (block-scaled 'fp8' checkpoints are "
                             "dequantised at load; GGUF files carry their own 4-bit weights)")
    if quantization.get("activation_scheme", "dynamic") != "dynamic":
        raise ModelLoadError(f"fp8 checkpoint with activation_scheme {quantization['activation_scheme']!r}: static "
                             "activation scales are not supported (only 'dynamic', weights dequantised at load)")
    if quantization.get("fmt", "e4m3") not in ("e4m3", "float8_e4m3fn"):  # DeepSeek's spelling, MiniMax's
        raise ModelLoadError(f"fp8 checkpoint of fmt {quantization['fmt']!r} is not supported (only 'e4m3')")
    block = quantization.get("weight_block_size")
    if not isinstance(block, list | tuple) or len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ModelLoadError(f"fp8 checkpoint without a weight_block_size of two sizes (got {block!r}): per-tensor "
                             "FP8 is not supported")
    return int(block[0]), int(block[1])


def dequantize_fp8_blocks(tensors: dict[str, torch.Tensor], block: tuple[int, int]) -> None:
    """Replace, in ``tensors``, each FP8 weight and its ``_scale_inv`` by the bf16 weight they encode; an FP8 tensor
    without its scale, or a scale without its weight, is refused naming it."""
    for scale_name in [name for name in tensors if name.endswith(SCALE_SUFFIX)]:
        name = scale_name.removesuffix(SCALE_SUFFIX)
        if name not in tensors:
            raise ModelLoadError(f"fp8 checkpoint: scale {scale_name!r} has no weight {name!r}")
        tensors[name] = dequantize_weight(name, tensors[name], tensors.pop(scale_name), block)
    unscaled = sorted(name for name, tensor in tensors.items() if tensor.dtype in FP8_DTYPES)
    if unscaled:
        raise ModelLoadError(f"fp8 checkpoint: tensor {unscaled[0]!r} is FP8 without its {SCALE_SUFFIX!r}")


def dequantize_weight(name: str, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``weight`` (``[..., rows, cols]`` FP8) times the scale of its block (``scale``: ``[..., ceil(rows / b0),
    ceil(cols / b1)]``), in bf16."""
    if weight.dtype not in FP8_DTYPES or weight.dim() < 2:
        raise ModelLoadError(f"fp8 checkpoint: {name!r} has a scale but is a {weight.dim()}-d {weight.dtype} tensor, "
                             "not a float8_e4m3fn matrix")
    rows, cols = weight.shape[-2:]
    grid = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale.shape) != (*weight.shape[:-2], *grid):
        raise ModelLoadError(f"fp8 checkpoint: the scale of {name!r} is {tuple(scale.shape)}; its "
                             f"{tuple(weight.shape)} weight in blocks of {block} needs {(*weight.shape[:-2], *grid)}")
    factors = (scale.float() - 127.0).exp2() if scale.dtype == torch.uint8 else scale.float()  # uint8: E8M0 bytes
    factors = factors.repeat_interleave(block[0], dim=-2)[..., :rows, :]
    factors = factors.repeat_interleave(block[1], dim=-1)[..., :cols]
    return (weight.float() * factors).to(DEQUANTIZED_DTYPE)
