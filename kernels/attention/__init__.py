"""Paged attention behind one interface.

``create_backend(name, device)`` gives an ``AttentionBackend``; per step call ``plan(meta)`` once with
an ``AttentionMetadata``, then ``forward(q, k, v, kv_cache, scale)`` per layer. ``"torch"`` works on
CPU and CUDA; ``"cpu_native"`` (CPU decode in C, compiled on first use, torch for the rest) and
``"flashinfer"`` (CUDA) are imported only when asked for, or picked by ``"auto"`` on their device.
"""

from kernels.attention.base import AttentionBackend, kv_cache_shape, write_kv
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import (
    BackendUnavailableError,
    UnknownBackendError,
    available_backends,
    create_backend,
    register_backend,
    registered_backends,
)
from kernels.attention.torch_paged import TorchPagedAttention

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "BackendUnavailableError",
    "TorchPagedAttention",
    "UnknownBackendError",
    "available_backends",
    "create_backend",
    "kv_cache_shape",
    "register_backend",
    "registered_backends",
    "write_kv",
]
