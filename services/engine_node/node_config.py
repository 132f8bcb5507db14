"""The settings the prefill and decode nodes share: :class:`EngineNodeConfig`, which makes the engine's
:class:`~services.engine.config.EngineConfig`. Importing it registers the engine's errors' status codes
(``errors.py``); the node's status is ``status.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import services.engine_node.errors  # noqa: F401  (the engine's errors as status codes)
from services.common.config import setting
from services.common.server_config import ServerConfig
from services.engine.admission import AdmissionConfig
from services.engine.config import EngineConfig
from services.engine.model_files import bundled_model_path
from services.engine_node.kv_ipc_wire import KV_IPC_MODES

CUDA_GRAPHS = ("on", "off")
FUSED_OPS = ("on", "off")


@dataclass(frozen=True)
class EngineNodeConfig(ServerConfig):
    """Settings of a node that runs the model (prefill or decode)."""

    model: str = setting("", "GGUF file or HF directory (default: the bundled SmolLM2-135M)")
    trust_remote_code: bool = setting(False, "run a tokenizer class the model directory brings (its "
                                             "tokenizer_config.json's auto_map: Kimi K2, Moonlight); off: refused")
    dtype: str = setting("bfloat16", "bfloat16 (fast) or float32 (exact parity)")
    device: str = setting("cpu", "where the model and the KV pool live: cpu, cuda or cuda:N")
    attention_backend: str = setting("auto", "auto (flashinfer on CUDA when installed, cpu_native on CPU, else "
                                             "torch), torch, cpu_native or flashinfer")
    cuda_graphs: str = setting("off", "on: decode-only steps replay CUDA graphs captured at start for batch sizes "
                                      "1, 2, 4 ... up to max_num_seqs (at most 256), padded to the next; off: "
                                      "every step runs eagerly (CUDA only)")
    fused_ops: str = setting("on", "on: on CUDA in bf16/fp16, FlashInfer's fused add+RMSNorm, SiLU-and-multiply and "
                                   "rope, each checked against torch at load (one that fails stays torch's, "
                                   "logged); off: torch's ops everywhere")
    kv_ipc: str = setting("auto", "KV between prefill and decode nodes on one host and GPU: auto (CUDA IPC after "
                                  "a probe, bytes on any failure) or off (always bytes); CPU nodes send bytes")
    block_size: int = setting(16, "tokens per KV block")
    num_kv_blocks: int = setting(0, "KV blocks in the pool (0: as many as kv_cache_gib holds)")
    kv_cache_gib: float = setting(1.0, "KV pool size when num_kv_blocks is 0")
    max_num_seqs: int = setting(128, "requests in one batch")
    max_num_batched_tokens: int = setting(1024, "tokens per step (the prefill chunk)")
    max_model_len: int = setting(0, "context length (0: the model's)")
    state_checkpoints: int = setting(-1, "a hybrid model's prefix cache: checkpoints of the recurrent state kept, each "
                                         "one request's state, out of kv_cache_gib (-1: a quarter of max_num_seqs; "
                                         "0: no prefix hits for hybrid models)")
    threads: int = setting(0, "torch threads (0: torch's default)")
    int4_max_rows: int = setting(8, "bf16 on CPU: steps of at most this many tokens run a Q4 GGUF's own 4-bit "
                                    "weights (0: always the dense bf16 weights)")
    deterministic: bool = setting(False, "batch-invariant numerics: a request's tokens do not depend on the load, "
                                         "cache hits, chunking or path (CPU; slower prefill, see docs/benchmarks.md)")
    admission_policy: str = setting("new_token_ratio", "blocks kept for running requests: new_token_ratio, "
                                                       "fixed or none")
    init_new_token_ratio: float = setting(0.7, "new_token_ratio: starting ratio of remaining tokens expected")
    min_new_token_ratio_factor: float = setting(0.14, "new_token_ratio: floor as a fraction of the initial ratio")
    new_token_ratio_decay_steps: int = setting(600, "new_token_ratio: quiet decode steps from initial to floor")
    clip_max_new_tokens: int = setting(4096, "new_token_ratio: cap on a request's remaining tokens")
    fixed_reserve_blocks: int = setting(8, "fixed: blocks kept per running request")
    fixed_min_reserve_blocks: int = setting(1, "fixed: floor the per-request blocks decay to")
    fixed_decay_steps: int = setting(600, "fixed: quiet decode steps from initial to floor")
    offload_host_gib: float = setting(1.0, "host memory for preempted requests' KV (0: recompute them)")
    offload_cache_store: str = setting("", "cache-store host:port for preempted KV once the host budget is full")
    engine_failure_exit_s: float = setting(2.0, "after an exception escapes the engine thread: health turns "
                                                "NOT_SERVING and streams end at once, the process exits (code 70) "
                                                "this many seconds later")
    stats_log_interval_s: float = setting(10.0, "seconds between the node's 'engine stats' log lines (running, "
                                                "waiting, KV usage, prompt and generation tokens/s), written "
                                                "while it has work; 0: none")
    offload_remote: str = setting("overflow", "when preempted KV goes to the offload cache-store: overflow (past the "
                                              "host budget) or always")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stats_log_interval_s < 0:
            raise ValueError(f"stats_log_interval_s must be >= 0 (0: none), got {self.stats_log_interval_s}")
        if self.engine_failure_exit_s < 0:
            raise ValueError(f"engine_failure_exit_s must be >= 0, got {self.engine_failure_exit_s}")
        if self.state_checkpoints < -1:
            raise ValueError(f"state_checkpoints must be >= 0 (-1: the default), got {self.state_checkpoints}")
        for name in ("num_kv_blocks", "max_model_len", "threads"):  # 0: the default
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: the default), got {getattr(self, name)}")
        self._engine_config(model_path="")  # the engine's own checks (sizes, dtype, block size): usage errors
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPHS)}, got {self.cuda_graphs!r}")
        if self.fused_ops not in FUSED_OPS:
            raise ValueError(f"fused_ops must be one of {', '.join(FUSED_OPS)}, got {self.fused_ops!r}")
        if self.kv_ipc not in KV_IPC_MODES:
            raise ValueError(f"kv_ipc must be one of {', '.join(KV_IPC_MODES)}, got {self.kv_ipc!r}")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")

    def admission_config(self) -> AdmissionConfig:
        return AdmissionConfig(
            policy=self.admission_policy, init_ratio=self.init_new_token_ratio,
            min_ratio_factor=self.min_new_token_ratio_factor, ratio_decay_steps=self.new_token_ratio_decay_steps,
            clip_tokens=self.clip_max_new_tokens, fixed_blocks=self.fixed_reserve_blocks,
            fixed_min_blocks=self.fixed_min_reserve_blocks, fixed_decay_steps=self.fixed_decay_steps,
        )

    def engine_config(self) -> EngineConfig:
        return self._engine_config(self.model or str(bundled_model_path()))

    def _engine_config(self, model_path: str) -> EngineConfig:
        return EngineConfig(
            admission=self.admission_config(), offload_host_gib=self.offload_host_gib,
            offload_cache_store=self.offload_cache_store, offload_remote=self.offload_remote,
            model_path=model_path, dtype=self.dtype, device=self.device,
            attention_backend=self.attention_backend, block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks or None, kv_cache_gib=self.kv_cache_gib,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len or None, int4_max_rows=self.int4_max_rows,
            state_checkpoints=None if self.state_checkpoints == -1 else self.state_checkpoints,
            deterministic=self.deterministic, cuda_graphs=self.cuda_graphs == "on", fused_ops=self.fused_ops == "on",
            trust_remote_code=self.trust_remote_code,
            # threads: the EngineWorker sets them on its thread
        )

