"""Engine settings (a frozen dataclass; services build it from flags and ``PDSERVE_*`` variables)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.engine.admission import AdmissionConfig

OFFLOAD_REMOTE = ("overflow", "always")
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
    # a hybrid model's prefix cache: checkpoints of the recurrent state kept (each one request's state, taken out of
    # kv_cache_gib; state_checkpoints.py); None: a quarter of max_num_seqs; 0: no prefix hits for hybrid models
    state_checkpoints: int | None = None
    attention_backend: str | None = None  # None/"auto": flashinfer on CUDA, cpu_native on CPU, else torch
    num_threads: int | None = None
    int4_max_rows: int = 8  # bf16 on CPU: steps of at most this many tokens use a Q4 GGUF's 4-bit weights (0: never)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)  # blocks kept for running requests
    offload_host_gib: float = 1.0  # host memory for preempted requests' KV (0: recompute them instead)
    offload_cache_store: str = ""  # cache-store address for preempted KV once the host budget is full
    offload_remote: str = "overflow"  # "always": preempted KV goes to the cache-store even with host room
    cache_outputs: bool = False  # finished requests' full blocks go to the cache-store (content keys)
    # Batch-invariant numerics: a request's tokens do not depend on the load, its cache hits, its chunking or
    # the path (one weight path for every step size, fixed-order attention; CPU only; see model/decoder.py).
    deterministic: bool = False
    # Decode-only steps replay CUDA graphs captured per batch-size bucket at start (decode_graphs.py; CUDA only).
    cuda_graphs: bool = False
    # CUDA bf16/fp16: add + RMSNorm, SiLU-and-multiply and rope run FlashInfer's fused kernels where each passes
    # its load check (model/fused_choice.py); False: the torch ops everywhere.
    fused_ops: bool = True
    trust_remote_code: bool = False  # run a tokenizer class the model directory brings (tokenizer.py)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.state_checkpoints is not None and self.state_checkpoints < 0:
            raise ValueError(f"state_checkpoints must be >= 0 (or unset), got {self.state_checkpoints}")
        for name in ("num_kv_blocks", "max_model_len", "num_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (or unset), got {getattr(self, name)}")
        if self.num_kv_blocks is None and self.kv_cache_gib <= 0:  # it sizes the pool only without num_kv_blocks
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.offload_host_gib < 0:
            raise ValueError(f"offload_host_gib must be >= 0, got {self.offload_host_gib}")
        if self.int4_max_rows < 0:
            raise ValueError(f"int4_max_rows must be >= 0, got {self.int4_max_rows}")
        if self.offload_remote not in OFFLOAD_REMOTE:
            raise ValueError(f"offload_remote must be one of {OFFLOAD_REMOTE}, got {self.offload_remote!r}")
        if self.cache_outputs and not self.offload_cache_store:
            raise ValueError("cache_outputs needs a cache-store (offload_cache_store)")
        if self.cuda_graphs and not self.device.startswith("cuda"):
            raise ValueError(f"cuda_graphs needs a CUDA device, not {self.device!r}")
        if self.cache_outputs and self.deterministic:
            raise ValueError("cache_outputs serves blocks of output positions as later prompts' prefixes, which the "
                             "deterministic mode never does (their numbers differ): use one or the other")

    @property
    def num_state_checkpoints(self) -> int:
        """A hybrid model's state checkpoints (0 without prefix caching)."""
        if not self.enable_prefix_caching:
            return 0
        return max(1, self.max_num_seqs // 4) if self.state_checkpoints is None else self.state_checkpoints

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
