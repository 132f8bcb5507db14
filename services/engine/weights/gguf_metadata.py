"""A GGUF file's metadata and what it says of the model (:func:`read_gguf_config`), torch-free: the gateway
reads a GGUF model's configuration without loading its weights (numpy and the ``gguf`` package only)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, ReaderTensor, quants

from kernels.rope_scaling import RopeScaling
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import (
    DERIVED_VOCAB_KEY,
    ROPE_SHORT_FACTORS_KEY,
    TENSOR_NAMES_KEY,
    TURN_END_KEY,
    TURN_END_TEXTS,
)
from services.engine.model.registry import config_from_gguf
from services.engine.weights.gguf_names import ROPE_FREQS, ROPE_SHORT_FACTORS, TensorRole, tensor_role

_EMBEDDING = "token_embd.weight"


def read_fields(reader: GGUFReader) -> dict[str, Any]:
    """Scalar and string metadata of the file (token lists are skipped: the tokenizer reads them), plus
    :data:`DERIVED_VOCAB_KEY`: the embedding's rows, else the token count, for files without ``{arch}.vocab_size``;
    :data:`TURN_END_KEY` (the ids of the architecture's :data:`TURN_END_TEXTS`), :data:`TENSOR_NAMES_KEY`,
    :data:`ROPE_SHORT_FACTORS_KEY` (where the file has them)."""
    fields: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type", "scores")):
            continue
        fields[key] = field.contents()
    embedding = next((t for t in reader.tensors if t.name == _EMBEDDING), None)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    ends = TURN_END_TEXTS.get(str(fields.get("general.architecture")), ())
    if tokens is not None and ends:
        ids = {text: i for i, text in enumerate(tokens.contents()) if text in ends}
        fields[TURN_END_KEY] = tuple(ids[text] for text in ends if text in ids)
    fields[TENSOR_NAMES_KEY] = tuple(t.name for t in reader.tensors)
    short = next((t for t in reader.tensors if t.name == ROPE_SHORT_FACTORS), None)
    if short is not None:
        # each float32 as its shortest decimal (the checkpoint's 1.3, not 1.2999999523…): the same float32 again
        fields[ROPE_SHORT_FACTORS_KEY] = tuple(float(str(f)) for f in dequantize(short).reshape(-1))
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
    roles = tensor_roles(reader, fields)
    rope_freqs = next((dequantize(t) for t, role in roles if role.kind == "rope_freqs"), None)
    return complete_config(config_from_gguf(fields), {t.name for t in reader.tensors}, rope_freqs)


def tensor_roles(reader: GGUFReader, fields: dict[str, Any]) -> list[tuple[ReaderTensor, TensorRole]]:
    """Each tensor's role; those of the multi-token-prediction blocks after the last decoder layer (the file's last
    ``nextn_predict_layers`` of ``block_count``: Qwen3.5's) are redundant, as their safetensors twins are not read."""
    architecture = str(fields.get("general.architecture", ""))
    mtp = int(fields.get(f"{architecture}.nextn_predict_layers") or 0)
    first_mtp = int(fields.get(f"{architecture}.block_count") or 0) - mtp if mtp else None
    return [(tensor, TensorRole("redundant") if first_mtp is not None and _layer_of(tensor.name) >= first_mtp
             else tensor_role(tensor.name, architecture)) for tensor in reader.tensors]


def _layer_of(name: str) -> int:
    """The ``blk.N`` layer a tensor belongs to (-1: none)."""
    parts = name.split(".", 2)
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else -1


def dequantize(tensor: ReaderTensor) -> np.ndarray:
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


def complete_config(config: ModelConfig, names: set[str], rope_freqs: np.ndarray | None) -> ModelConfig:
    """What the metadata does not say: a tied head (no ``output.weight``), attention biases (llama.cpp's
    llama graph takes them where present; Qwen2 always has q/k/v ones) and the ``rope_freqs`` divisors (of a
    proportional rope, Gemma 4's: the pairs that rotate, :func:`_rotated_fraction`)."""
    layer_tensors = {name.split(".", 2)[-1] for name in names if name.startswith("blk.")}
    changes: dict[str, Any] = {
        "tie_word_embeddings": "output.weight" not in names,
        "qkv_bias": config.qkv_bias or "attn_q.bias" in layer_tensors,
        "o_bias": config.o_bias or "attn_output.bias" in layer_tensors,
    }
    if rope_freqs is None and config.rope_scaling is not None and config.rope_scaling.rope_type == "proportional":
        raise ModelLoadError(f"GGUF {config.architecture}: the full layers' proportional rope needs the "
                             f"{ROPE_FREQS!r} tensor (llama.cpp's loader requires it too)")
    if rope_freqs is not None:
        factors = rope_freqs.reshape(-1)
        if factors.size != config.head_dim // 2:
            raise ModelLoadError(f"GGUF tensor {ROPE_FREQS!r} has {factors.size} factors; head_dim "
                                 f"{config.head_dim} needs {config.head_dim // 2}")
        scaling = config.rope_scaling or RopeScaling()
        if scaling.rope_type == "proportional":
            changes["rope_scaling"] = dataclasses.replace(scaling, rotated_fraction=_rotated_fraction(factors))
        else:
            changes["rope_scaling"] = dataclasses.replace(scaling, freq_factors=tuple(float(f) for f in factors))
    return dataclasses.replace(config, **changes)


FROZEN_PAIR = 1e29
"""A ``rope_freqs`` divisor at least this large stops its pair from rotating (llama.cpp's Gemma 4 converter writes
1e30 for the pairs a proportional rope leaves unrotated)."""


def _rotated_fraction(factors: np.ndarray) -> float:
    """The ``rotated_fraction`` of a proportional rope whose leading pairs rotate (divisor 1) and the rest not
    (:data:`FROZEN_PAIR`), as llama.cpp's converter writes them; other divisors are refused naming them."""
    rotated = int(np.count_nonzero(factors == 1.0))
    if not (np.all(factors[:rotated] == 1.0) and np.all(factors[rotated:] >= FROZEN_PAIR)):
        raise ModelLoadError(f"GGUF tensor {ROPE_FREQS!r} of a proportional rope must be 1 for the pairs that rotate, "
                             f"then >= {FROZEN_PAIR:g}; got {factors.tolist()}")
    fraction = rotated / factors.size
    if int(fraction * 2 * factors.size // 2) != rotated:  # as rope_frequencies counts the angles back
        raise ModelLoadError(f"GGUF tensor {ROPE_FREQS!r}: {rotated} rotated pairs of {factors.size} is not a "
                             "fraction the proportional rope can express")
    return fraction
