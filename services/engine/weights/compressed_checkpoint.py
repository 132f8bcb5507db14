"""Checkpoints saved by llm-compressor (``quantization_config`` ``quant_method: compressed-tensors``): Kimi K2
Thinking's, K2.5's and K2.6's own releases (their routed experts INT4 in groups of 32, symmetric) and the W4A16,
W8A16, W8A8 and FP8 checkpoints Red Hat and the community publish. Each quantized linear's weight is decompressed at
load by the compressed-tensors library (the one transformers and vLLM read these files with) into a dense weight in
the dtype of its scale (bf16 or fp16; a float32 scale gives bf16), bit for bit the weight transformers'
``CompressedTensorsConfig(dequantize=True)`` load holds; the tensors the checkpoint leaves unquantized (its ``ignore``
list: embeddings, norms, the head, routers, Kimi's attention and shared experts) are read as stored.

Served formats: ``pack-quantized`` (1-8-bit integers packed in int32: ``weight_packed``, ``weight_scale``,
``weight_shape``, and a packed ``weight_zero_point`` where asymmetric), ``int-quantized`` / ``naive-quantized`` (int8
stored as int8) and ``float-quantized`` (float8 e4m3 weights), with a scale per tensor, channel, group or block.
Activations stay in the serving dtype, as transformers' dequantising load computes them: a scheme that quantizes
activations (W8A8, FP8-dynamic) is served with its weights dequantised and its static ``input_scale``s dropped (vLLM
and SGLang run quantized GEMMs there instead, faster on GPUs and bit-equal to neither; as FP8 block checkpoints,
:mod:`fp8_blocks`).

Which modules are quantized is read from the tensors (a module stored as ``weight_packed``, or with a
``weight_scale``, is), so every config group must quantize weights alike (one scheme for the checkpoint). Refused by
name: other formats (NVFP4, MXFP4, sparse, marlin-24, mixed precision) and a ``sparsity_config``, groups whose weight
settings differ, fused expert tensors (``…gate_up_proj_packed``), GPTQ's activation order (``weight_g_idx``; the
library's own validation refuses ``actorder: group``), a quantized KV cache (``kv_cache_scheme``), a module missing
one of its tensors or a tensor of no module (the all-zero zero points older files store beside symmetric weights are
dropped). A family's names for ``X.weight`` carry ``X.weight_packed`` and the rest along (:func:`compressed_renamer`).
The library is imported only when such a checkpoint is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from services.engine.errors import ModelLoadError
from services.engine.weights.fp8_blocks import DEQUANTIZED_DTYPE, checkpoint_quantization

METHOD = "compressed-tensors"
SERVED_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
# each quantized module's tensors beside its weight that decompression consumes or drops
_SCALE = "weight_scale"
_PACKED = "weight_packed"
_DROPPED = (".input_scale", ".input_zero_point", ".input_global_scale", ".output_scale", ".output_zero_point")
_ZERO_POINT = ".weight_zero_point"
_COMPRESSION_SUFFIXES = ("_packed", "_shape", ".weight_scale", _ZERO_POINT, ".weight_g_idx")
_KEPT_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class CompressedScheme:
    """A compressed-tensors checkpoint's format and its one scheme (compressed-tensors' ``QuantizationScheme``)."""

    format: str
    scheme: Any


def compressed_scheme(hf_config: Mapping[str, Any]) -> CompressedScheme | None:
    """The scheme of a compressed-tensors checkpoint (None: not one); one that cannot be served exactly is refused
    naming what it has."""
    quantization = checkpoint_quantization(hf_config)
    if quantization.get("quant_method") != METHOD:
        return None
    from compressed_tensors.quantization import QuantizationConfig
    from pydantic import ValidationError

    try:
        config = QuantizationConfig.model_validate(quantization)
    except ValidationError as error:
        raise ModelLoadError(f"{METHOD} checkpoint: its quantization_config is not one ({error.errors()[0]['msg']} "
                             f"at {error.errors()[0]['loc']})") from None
    if config.format not in SERVED_FORMATS:
        raise ModelLoadError(f"{METHOD} checkpoint of format {config.format!r} is not supported (only "
                             f"{', '.join(SERVED_FORMATS)})")
    if config.kv_cache_scheme is not None:
        raise ModelLoadError(f"{METHOD} checkpoint with a kv_cache_scheme (a quantized KV cache) is not supported")
    sparsity = (quantization.get("sparsity_config") or {}).get("format", "dense")
    if sparsity != "dense":
        raise ModelLoadError(f"{METHOD} checkpoint with a sparsity_config of format {sparsity!r} is not supported "
                             "(only dense weights are decompressed)")
    schemes = list(config.config_groups.values())
    if not schemes or any(scheme.weights is None for scheme in schemes):
        raise ModelLoadError(f"{METHOD} checkpoint: a config group without weights settings (activation-only "
                             "quantization) is not supported")
    if any(scheme.weights != schemes[0].weights for scheme in schemes):
        raise ModelLoadError(f"{METHOD} checkpoint: its config groups quantize weights differently (mixed "
                             "precision) — only one weights setting for every group is supported")
    formats = {scheme.format for scheme in schemes} - {None, config.format}
    if formats:
        raise ModelLoadError(f"{METHOD} checkpoint: a config group of format {sorted(formats)[0]!r} beside "
                             f"{config.format!r} (mixed formats) is not supported")
    return CompressedScheme(config.format, schemes[0])


def compressed_renamer(rename: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """``rename`` (a family's map of checkpoint names) over a compressed checkpoint's names: a quantized module's
    ``weight_packed``, ``weight_scale``, … go where its ``weight`` goes (a family's map may match ``.weight`` names
    only: Mixtral's ``w1.weight``)."""

    def renamed(name: str) -> str | None:
        module, _, param = name.rpartition(".")
        if not param.startswith("weight_") or param in ("weight_scale_inv",):  # (FP8's scales: mapped by the family)
            return rename(name)
        weight = rename(f"{module}.weight")
        return None if weight is None else f"{weight.removesuffix('.weight')}.{param}"

    return renamed


def decompress_weights(tensors: dict[str, torch.Tensor], compressed: CompressedScheme) -> None:
    """Replace, in ``tensors``, each quantized module's tensors by its dense ``weight``; the activation scales are
    dropped. A module short of a tensor its format stores is refused naming it."""
    from compressed_tensors.compressors.base import BaseCompressor

    compressor = BaseCompressor.get_value_from_registry(compressed.format)
    params = compressor.compression_param_names(compressed.scheme)
    for name in [name for name in tensors if name.endswith(_DROPPED)]:
        del tensors[name]
    if compressed.scheme.weights.symmetric:  # checkpoints saved before mid-2024 stored all-zero zero points
        for name in [name for name in tensors if name.endswith(_ZERO_POINT)]:
            if not tensors[name].any():
                del tensors[name]
    marker = _PACKED if _PACKED in params else _SCALE
    modules = [name.removesuffix("." + marker) for name in tensors if name.endswith("." + marker)]
    for module in modules:
        missing = [param for param in params if f"{module}.{param}" not in tensors]
        if missing:
            raise ModelLoadError(f"{METHOD} checkpoint: {module!r} has no {missing[0]!r} beside its {marker!r}")
        local = {param: tensors.pop(f"{module}.{param}") for param in params}
        try:
            weight = compressor.decompress(local, compressed.scheme)["weight"]
        except (RuntimeError, ValueError) as error:
            raise ModelLoadError(f"{METHOD} checkpoint: {module!r} does not decompress ({error})") from None
        tensors[f"{module}.weight"] = weight if weight.dtype in _KEPT_DTYPES else weight.to(DEQUANTIZED_DTYPE)
    # what no quantized weight took: another layout (fused experts, ``…gate_up_proj_packed``), a scale without its
    # weight, a zero point or GPTQ's activation order
    leftover = sorted(name for name in tensors if name.endswith(_COMPRESSION_SUFFIXES))
    if leftover:
        raise ModelLoadError(f"{METHOD} checkpoint: {leftover[0]!r} belongs to no quantized weight of its format "
                             f"({compressed.format})")
