"""Read a llama GGUF file with the ``gguf`` package, dequantise to float32, rename to Hugging Face names.

llama.cpp's converter permutes the rows of ``q_proj``/``k_proj`` so that its interleaved-pair rope matches
Hugging Face's rotate-half rope; :func:`unpermute_rope_rows` undoes that.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, quants

from kernels.int4_linear import GroupQuantized
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.registry import config_from_gguf
from services.engine.weights.gguf_q4 import Q4_TYPES, decode_q4
from services.engine.weights.loader import LoadedWeights

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation: per head, rows (pair, 2) become (2, pair)."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def read_fields(reader: GGUFReader) -> dict[str, Any]:
    """Scalar and string metadata of the file (token lists are skipped: the tokenizer reads them)."""
    fields: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type", "scores")):
            continue
        fields[key] = field.contents()
    return fields


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.match(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


def open_gguf(path: Path) -> GGUFReader:
    try:
        return GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from exc


def read_gguf_config(path: Path) -> ModelConfig:
    return config_from_gguf(read_fields(open_gguf(path)))


def load_gguf(path: Path, keep_q4: bool = False) -> LoadedWeights:
    reader = open_gguf(path)
    config = config_from_gguf(read_fields(reader))
    tensors: dict[str, torch.Tensor] = {}
    quantized: dict[str, GroupQuantized] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue  # e.g. rope_freqs: recomputed from the metadata
        array = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        heads = _rope_heads(name, config)
        if heads:
            array = unpermute_rope_rows(array, heads)
        if not array.flags.writeable or not array.flags.c_contiguous:  # memory-mapped F32 tensors
            array = np.array(array, order="C")
        tensors[name] = torch.from_numpy(array)
        if keep_q4 and tensor.tensor_type in Q4_TYPES and ".layers." in name:
            codes = decode_q4(tensor.data, tensor.tensor_type, array.shape)
            quantized[name] = codes.rows(torch.from_numpy(unpermute_rope_rows(np.arange(array.shape[0]), heads))) \
                if heads else codes
    tied = "lm_head.weight" not in tensors
    config = ModelConfig(**{**config.__dict__, "tie_word_embeddings": tied})
    return LoadedWeights(config=config, tensors=tensors, source=path, quantized=quantized)


def _rope_heads(name: str, config: ModelConfig) -> int:
    """Heads whose rows llama.cpp permuted in this tensor (0: not permuted; only its llama converter does)."""
    if config.architecture != "llama":
        return 0
    if name.endswith("q_proj.weight"):
        return config.num_heads
    if name.endswith("k_proj.weight"):
        return config.num_kv_heads
    return 0
