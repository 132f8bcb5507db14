"""Engine settings (a frozen dataclass; services build it from flags and ``PDSERVE_*`` variables)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.engine.admission import AdmissionConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    dtype: str = "bfloat16"  # "float32" is the exact-parity mode
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: as many as kv_cache_gib holds
    kv_cache_gib: float = 1.0
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None  # default: the model's context length
    enable_prefix_caching: bool = True
    attention_backend: str | None = None  # None/"auto": flashinfer on CUDA, cpu_native on CPU, else torch
    num_threads: int | None = None
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)  # blocks kept for running requests
    offload_host_gib: float = 1.0  # host memory for preempted requests' KV (0: recompute them instead)
    offload_cache_store: str = ""  # cache-store address for preempted KV once the host budget is full

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
