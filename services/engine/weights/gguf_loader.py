"""Read a GGUF file (architectures ``llama``, ``granite``, ``granitemoe``, ``qwen2``, ``qwen3``, ``qwen2moe``,
``qwen3moe``, ``gemma2``, ``gemma3``) with the ``gguf`` package, dequantise to float32 and rename to Hugging Face names
(:mod:`services.engine.weights.gguf_names`).

- llama.cpp's converter permutes the rows of ``q_proj``/``k_proj`` (weights and biases) so that its
  interleaved-pair rope matches Hugging Face's rotate-half rope, for the ``llama``, ``granite`` and ``granitemoe``
  architectures only (its Qwen converters store them as they are); :func:`unpermute_rope_rows` undoes that.
- Sparse experts are stored as one 3-D tensor per projection; each slice becomes one expert's weight.
- Gemma 2's and 3's norms are stored as ``1 + weight`` (:data:`~services.engine.weights.gguf_names.NORM_OFFSETS`); the
  1 is taken off (in float32) and its layers' own names are mapped.
- ``rope_freqs`` (Llama 3.1+: the llama3 rope scaling as per-dimension divisors of ``inv_freq``, which is
  how llama.cpp applies it) becomes ``ModelConfig.rope_scaling.freq_factors``.
- Whether the head is tied and whether attention has biases is read from the tensors present.
- A tensor name the loader does not know, or a quant type the ``gguf`` package cannot dequantise, is a
  :class:`ModelLoadError` naming the tensor; nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor, quants

from kernels.int4_linear import GroupQuantized
from kernels.rope_scaling import RopeScaling
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import DERIVED_VOCAB_KEY, END_OF_TURN_KEY, END_OF_TURN_TEXT
from services.engine.model.registry import config_from_gguf
from services.engine.weights.gguf_names import GEMMA_ARCHITECTURES, NORM_OFFSETS, ROPE_FREQS, TensorRole, tensor_role
from services.engine.weights.gguf_q4 import Q4_TYPES, decode_q4
from services.engine.weights.loader import LoadedWeights

_EMBEDDING = "token_embd.weight"


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation: per head, rows (pair, 2) become (2, pair)."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def read_fields(reader: GGUFReader) -> dict[str, Any]:
    """Scalar and string metadata of the file (token lists are skipped: the tokenizer reads them), plus
    :data:`DERIVED_VOCAB_KEY`: the embedding's rows, else the token count, for files without ``{arch}.vocab_size``;
    for Gemma 2 and 3, :data:`END_OF_TURN_KEY`."""
    fields: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type", "scores")):
            continue
        fields[key] = field.contents()
    embedding = next((t for t in reader.tensors if t.name == _EMBEDDING), None)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None and fields.get("general.architecture") in GEMMA_ARCHITECTURES:
        texts = tokens.contents()
        if END_OF_TURN_TEXT in texts:
            fields[END_OF_TURN_KEY] = texts.index(END_OF_TURN_TEXT)
    if embedding is not None:
        fields[DERIVED_VOCAB_KEY] = int(embedding.shape[-1])  # GGUF shapes are innermost first: [hidden, vocab]
    elif tokens is not None:
        fields[DERIVED_VOCAB_KEY] = len(tokens.data)
    return fields


def open_gguf(path: Path) -> GGUFReader:
    try:
        return GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        if "GGMLQuantizationType" in str(exc):  # the reader fails before it can name the tensor
            raise ModelLoadError(f"{path}: a tensor has a quant type the gguf package does not know, so pdserve "
                                 f"cannot dequantize it ({exc})") from exc
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from exc


def read_gguf_config(path: Path) -> ModelConfig:
    """The configuration :func:`load_gguf` would give, without dequantising the weights."""
    reader = open_gguf(path)
    fields = read_fields(reader)
    roles = _roles(reader, fields)
    rope_freqs = next((_dequantize(t) for t, role in roles if role.kind == "rope_freqs"), None)
    return _complete(config_from_gguf(fields), {t.name for t in reader.tensors}, rope_freqs)


def load_gguf(path: Path, keep_q4: bool = False) -> LoadedWeights:
    """``keep_q4``: also keep the 4-bit codes of the layers' Q4_0/Q4_1 matrices (see :class:`LoadedWeights`)."""
    reader = open_gguf(path)
    fields = read_fields(reader)
    roles = _roles(reader, fields)  # every name is checked before anything is dequantised
    config = config_from_gguf(fields)
    norm_offset = NORM_OFFSETS.get(str(fields.get("general.architecture")), 0.0)
    tensors: dict[str, torch.Tensor] = {}
    quantized: dict[str, GroupQuantized] = {}
    rope_freqs = None
    for tensor, role in roles:
        if role.kind == "redundant":
            continue
        array = _dequantize(tensor)
        if role.kind == "rope_freqs":
            rope_freqs = array
            continue
        if role.kind == "experts":
            if array.ndim != 3:
                raise ModelLoadError(f"GGUF tensor {tensor.name!r} has shape {array.shape}; expected "
                                     "[num_experts, out, in]")
            for expert, weight in enumerate(array):
                name = role.expert_name(expert)
                tensors[name] = torch.from_numpy(weight)
                if keep_q4 and tensor.tensor_type in Q4_TYPES:
                    quantized[name] = decode_q4(tensor.data[expert], tensor.tensor_type, weight.shape)
            continue
        name = role.hf_name
        heads = _rope_heads(name, config)
        if heads:
            array = unpermute_rope_rows(array, heads)
        if norm_offset and tensor.name.endswith("norm.weight"):
            array = array - np.float32(norm_offset)
        tensors[name] = torch.from_numpy(array)
        if keep_q4 and tensor.tensor_type in Q4_TYPES and ".layers." in name and array.ndim == 2:
            codes = decode_q4(tensor.data, tensor.tensor_type, array.shape)
            quantized[name] = codes.rows(torch.from_numpy(unpermute_rope_rows(np.arange(array.shape[0]), heads))) \
                if heads else codes
    config = _complete(config, {t.name for t in reader.tensors}, rope_freqs)
    return LoadedWeights(config=config, tensors=tensors, source=path, quantized=quantized)


def _roles(reader: GGUFReader, fields: dict[str, Any]) -> list[tuple[ReaderTensor, TensorRole]]:
    architecture = str(fields.get("general.architecture", ""))
    return [(tensor, tensor_role(tensor.name, architecture)) for tensor in reader.tensors]


def _dequantize(tensor: ReaderTensor) -> np.ndarray:
    """Float32, C-contiguous and writeable (memory-mapped F32 tensors are copied)."""
    try:
        array = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise ModelLoadError(f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which pdserve "
                             f"cannot dequantize ({exc})") from exc
    array = np.asarray(array, dtype=np.float32)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    return array


def _complete(config: ModelConfig, names: set[str], rope_freqs: np.ndarray | None) -> ModelConfig:
    """What the metadata does not say: a tied head (no ``output.weight``), attention biases (llama.cpp's
    llama graph takes them where present; Qwen2 always has q/k/v ones) and the ``rope_freqs`` divisors."""
    layer_tensors = {name.split(".", 2)[-1] for name in names if name.startswith("blk.")}
    changes: dict[str, Any] = {
        "tie_word_embeddings": "output.weight" not in names,
        "qkv_bias": config.qkv_bias or "attn_q.bias" in layer_tensors,
        "o_bias": config.o_bias or "attn_output.bias" in layer_tensors,
    }
    if rope_freqs is not None:
        factors = rope_freqs.reshape(-1)
        if factors.size != config.head_dim // 2:
            raise ModelLoadError(f"GGUF tensor {ROPE_FREQS!r} has {factors.size} factors; head_dim "
                                 f"{config.head_dim} needs {config.head_dim // 2}")
        scaling = config.rope_scaling or RopeScaling()
        changes["rope_scaling"] = dataclasses.replace(scaling, freq_factors=tuple(float(f) for f in factors))
    return dataclasses.replace(config, **changes)


def _rope_heads(name: str, config: ModelConfig) -> int:
    """Heads whose rows llama.cpp permuted in this tensor (0: not permuted; only its llama converter does, and
    Granite's, which is the llama one's subclass)."""
    if config.architecture not in ("llama", "granite", "granite_moe"):
        return 0
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return 0
