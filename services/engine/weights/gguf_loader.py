"""Read a GGUF file (architectures ``llama``, ``granite``, ``granitemoe``, ``qwen2``, ``qwen3``, ``qwen2moe``,
``qwen3moe``, ``qwen35``, ``qwen35moe``, ``qwen2vl``, ``qwen3vl``, ``qwen3vlmoe``, ``gemma2``, ``gemma3``, ``gemma4``,
``gpt-oss``, ``lfm2``, ``lfm2moe``, ``deepseek2``, ``glm4``, ``glm4moe``, ``phi3``, ``mistral3``, ``smollm3``,
``seed_oss``, ``olmo2``, ``olmoe``, ``ernie4_5``, ``ernie4_5-moe``, ``minimax-m2``, ``qwen3next``, ``mistral4``,
``granitehybrid``, ``nemotron_h``, ``exaone``, ``dots1``, ``arcee``, …: the registry's) with the ``gguf`` package,
dequantise to float32 (MXFP4: bfloat16, exact) and rename to Hugging Face names
(:mod:`services.engine.weights.gguf_names`).

- llama.cpp's converter permutes the rows of ``q_proj``/``k_proj`` (weights and biases) so that its interleaved-pair
  rope matches Hugging Face's rotate-half rope, for the ``llama``, ``granite``, ``granitemoe``, ``granitehybrid``,
  ``nemotron_h``, ``mistral3``, ``smollm3`` and ``arcee`` architectures only (its other converters store them as they
  are); :func:`unpermute_rope_rows` undoes that.
- Sparse experts are stored as one 3-D tensor per projection; each slice becomes one expert's weight, or, for a family
  with a loader hook (``Family.gguf_tensors``: GPT-OSS's, whose experts transformers holds stacked with biases), the
  stacks are kept whole and the hook lays them out. A hook also undoes a converter's other transforms (LFM2's squeezed
  conv, Qwen3.5's DeltaNet, DeepSeek's kv_b split in two); the 4-bit codes of a tensor it changed are not kept.
- Gemma 2's, Gemma 3's and Qwen3.5's norms are stored as ``1 + weight`` (Gemma 4's as they are)
  (:func:`~services.engine.weights.gguf_names.norm_offset`); the 1 is taken off (in float32) and their layers' own
  names are mapped. A multi-token-prediction block after the last layer (``nextn_predict_layers``) is not read.
- ``rope_freqs`` (Llama 3.1+: the llama3 rope scaling as per-dimension divisors of ``inv_freq``, which is how
  llama.cpp applies it) becomes ``ModelConfig.rope_scaling.freq_factors``; Gemma 4's (1 on the pairs that rotate, 1e30
  on the others) its proportional rope's ``rotated_fraction``. Gemma 4's experts are kept stacked, as its decoder
  reads them.
- Whether the head is tied and whether attention has biases is read from the tensors present.
- A tensor name the loader does not know, or a quant type the ``gguf`` package cannot dequantise, is a
  :class:`ModelLoadError` naming the tensor; nothing is dropped silently.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor

from kernels.int4_linear import GroupQuantized
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.registry import config_from_gguf, gguf_tensors_hook
from services.engine.weights.gguf_metadata import complete_config, dequantize, open_gguf, read_fields, tensor_roles
from services.engine.weights.gguf_names import norm_offset
from services.engine.weights.gguf_q4 import Q4_TYPES, decode_q4
from services.engine.weights.loader import LoadedWeights


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation: per head, rows (pair, 2) become (2, pair)."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def load_gguf(path: Path, keep_q4: bool = False) -> LoadedWeights:
    """``keep_q4``: also keep the 4-bit codes of the layers' Q4_0/Q4_1 matrices (see :class:`LoadedWeights`)."""
    reader = open_gguf(path)
    fields = read_fields(reader)
    roles = tensor_roles(reader, fields)  # every name is checked before anything is dequantised
    config = config_from_gguf(fields)
    architecture = str(fields.get("general.architecture"))
    tensors: dict[str, torch.Tensor] = {}
    quantized: dict[str, GroupQuantized] = {}
    rope_freqs = None
    for tensor, role in roles:
        if role.kind in ("redundant", "metadata"):
            continue
        array = dequantize(tensor)
        if role.kind == "rope_freqs":
            rope_freqs = array
            continue
        if role.kind == "stacked":  # laid out by the family's hook below
            tensors[role.hf_name] = _as_tensor(array, tensor)
            continue
        if role.kind == "experts":
            if array.ndim != 3:
                raise ModelLoadError(f"GGUF tensor {tensor.name!r} has shape {array.shape}; expected "
                                     "[num_experts, out, in]")
            for expert, weight in enumerate(array):
                name = role.expert_name(expert)
                tensors[name] = _as_tensor(weight, tensor)
                if keep_q4 and tensor.tensor_type in Q4_TYPES:
                    quantized[name] = decode_q4(tensor.data[expert], tensor.tensor_type, weight.shape)
            continue
        name = role.hf_name
        heads = _rope_heads(name, config)
        if heads:
            array = unpermute_rope_rows(array, heads)
        if offset := norm_offset(architecture, tensor.name):
            array = array - np.float32(offset)
        tensors[name] = _as_tensor(array, tensor)
        if keep_q4 and tensor.tensor_type in Q4_TYPES and ".layers." in name and array.ndim == 2:
            codes = decode_q4(tensor.data, tensor.tensor_type, array.shape)
            quantized[name] = codes.rows(torch.from_numpy(unpermute_rope_rows(np.arange(array.shape[0]), heads))) \
                if heads else codes
    config = complete_config(config, {t.name for t in reader.tensors}, rope_freqs)
    hook = gguf_tensors_hook(config.architecture)
    if hook is not None:
        laid_out = hook(tensors, config)
        # the 4-bit codes stand for the file's layout: those of a tensor the hook changed are dropped (it runs dense)
        quantized = {name: codes for name, codes in quantized.items() if laid_out.get(name) is tensors.get(name)}
        tensors = laid_out
    return LoadedWeights(config=config, tensors=tensors, source=path, quantized=quantized)


def _as_tensor(array: np.ndarray, tensor: ReaderTensor) -> torch.Tensor:
    """A dequantised array as a tensor: bfloat16 for an MXFP4 one (every value, a 4-bit float times a power of
    two, is exact in bfloat16: half float32's memory, as transformers loads GPT-OSS's MXFP4 experts), else float32."""
    out = torch.from_numpy(array)
    return out.to(torch.bfloat16) if tensor.tensor_type == GGMLQuantizationType.MXFP4 else out


def _rope_heads(name: str, config: ModelConfig) -> int:
    """Heads whose rows llama.cpp permuted in this tensor (0: not permuted; only its llama converter does, and
    Granite's (4.0's hybrids too), Nemotron-H's, Mistral 3's, SmolLM3's and Arcee's, which are the llama one's
    subclasses)."""
    if config.architecture not in ("llama", "granite", "granite_moe", "granite_hybrid", "nemotron_h", "mistral3",
                                   "smollm3", "arcee"):
        return 0
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return 0
