"""What the prefill and decode nodes share: engine settings, engine construction, error mapping, status.

(``services.common`` otherwise imports nothing of the engine; this module and ``sampling_convert`` are
the two bridges, kept here so both node packages use one definition.)
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from pdserve.v1 import gateway_pb2, node_pb2

from kvcache.kv_bytes import bytes_per_block
from services.common.config import setting
from services.common.errors import map_error
from services.common.server import ServerConfig
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import InvalidRequestError, ModelLoadError, UnknownRequestError
from services.engine.model_files import bundled_model_path
from services.engine.reservations import IncompleteTransferError

map_error(InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT)
map_error(UnknownRequestError, grpc.StatusCode.NOT_FOUND)
map_error(IncompleteTransferError, grpc.StatusCode.FAILED_PRECONDITION)
map_error(ModelLoadError, grpc.StatusCode.FAILED_PRECONDITION)


@dataclass(frozen=True)
class EngineNodeConfig(ServerConfig):
    """Settings of a node that runs the model (prefill or decode)."""

    model: str = setting("", "GGUF file or HF directory (default: the bundled SmolLM2-135M)")
    dtype: str = setting("bfloat16", "bfloat16 (fast) or float32 (exact parity)")
    block_size: int = setting(16, "tokens per KV block")
    num_kv_blocks: int = setting(0, "KV blocks in the pool (0: as many as kv_cache_gib holds)")
    kv_cache_gib: float = setting(1.0, "KV pool size when num_kv_blocks is 0")
    max_num_seqs: int = setting(128, "requests in one batch")
    max_num_batched_tokens: int = setting(1024, "tokens per step (the prefill chunk)")
    max_model_len: int = setting(0, "context length (0: the model's)")
    threads: int = setting(0, "torch threads (0: torch's default)")
    advertise: str = setting("", "address other nodes reach this one at (default: the bound address)")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model_path=self.model or str(bundled_model_path()), dtype=self.dtype, block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks or None, kv_cache_gib=self.kv_cache_gib,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len or None,  # threads: the EngineWorker sets them on its thread
        )


def node_status(engine: LLMEngine, role: str, address: str, healthy: bool = True) -> gateway_pb2.NodeStatus:
    """The engine's counters as a ``NodeStatus`` (call on the engine thread)."""
    pool, stats = engine.kv.pool, engine.scheduler.stats
    reserved = engine.reservations.num_reserved_blocks
    return gateway_pb2.NodeStatus(
        address=address, role=role, healthy=healthy, block_size=engine.kv.block_size,
        blocks_total=engine.kv.num_blocks,
        blocks_free=pool.num_free_blocks - pool.num_cached_blocks,
        blocks_reserved=reserved, blocks_cached=pool.num_cached_blocks,
        requests_running=len(engine.scheduler.running), requests_waiting=len(engine.scheduler.waiting),
        preemptions_total=stats.preemptions_total, prefix_hit_tokens_total=stats.prefix_hit_tokens_total,
        prompt_tokens_total=stats.prompt_tokens_total, evictions_total=pool.num_evictions,
        bytes_total=engine.runner.kv_cache_bytes,
    )


def kv_layout(engine: LLMEngine) -> node_pb2.KVLayout:
    cfg = engine.model.config
    return node_pb2.KVLayout(
        dtype=engine.config.dtype, block_size=engine.kv.block_size, num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, model_fingerprint=engine.fingerprint,
        bytes_per_block=bytes_per_block(engine.runner.kv_cache),
    )
