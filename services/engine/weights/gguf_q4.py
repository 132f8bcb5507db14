"""GGUF's Q4_0 and Q4_1 blocks as 4-bit codes with a scale and an offset per block of 32 weights.

A Q4_1 block is ``d`` (fp16), ``m`` (fp16) and 16 bytes of nibbles: weight ``j`` is ``d * q_j + m``
where ``q_j`` is the low nibble of byte ``j`` for ``j < 16`` and the high nibble of byte ``j - 16``
otherwise. Q4_0 has no ``m``: weight ``j`` is ``d * (q_j - 8)``, i.e. an offset of ``-8 d``.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

from kernels.int4_linear import GroupQuantized

Q4_BLOCK = 32
_HEADER_BYTES = {GGMLQuantizationType.Q4_0: 2, GGMLQuantizationType.Q4_1: 4}
Q4_TYPES = frozenset(_HEADER_BYTES)


def decode_q4(raw: np.ndarray, tensor_type: GGMLQuantizationType, shape: tuple[int, int]) -> GroupQuantized:
    """Codes, scales and offsets of a Q4_0/Q4_1 tensor of logical ``shape`` ``[out, in]`` from its raw bytes
    (``GGUFReader``'s ``tensor.data``)."""
    header = _HEADER_BYTES[tensor_type]
    out_features, in_features = shape
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(out_features, in_features // Q4_BLOCK,
                                                                header + Q4_BLOCK // 2)
    scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if tensor_type == GGMLQuantizationType.Q4_1:
        offsets = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    else:
        offsets = -8.0 * scales
    nibbles = blocks[..., header:]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(out_features, in_features)
    return GroupQuantized(torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(offsets), Q4_BLOCK)
