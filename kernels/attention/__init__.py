"""Paged attention behind one interface.

``create_backend(name, device)`` gives an ``AttentionBackend``; per step call ``plan(meta)`` once with
an ``AttentionMetadata``, then ``forward(q, k, v, kv_cache, scale)`` per layer. ``"torch"`` works on
CPU and CUDA; ``"flashinfer"`` (CUDA) is imported only when asked for.
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
