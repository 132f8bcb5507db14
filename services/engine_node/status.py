"""An engine node's ``NodeStatus``: the engine's stats snapshot plus what the node knows of itself."""

from __future__ import annotations

from pdserve.v1 import gateway_pb2

from services.engine.stats import EngineStats
from services.engine_node.kv_layout import kv_layout, layout_id


def node_status(stats: EngineStats, role: str, address: str, healthy: bool = True) -> gateway_pb2.NodeStatus:
    """``stats`` (``await worker.call(LLMEngine.stats)``) as the node's ``NodeStatus``."""
    return gateway_pb2.NodeStatus(
        requests_total=stats.requests_total, prefix_hit_requests_total=stats.prefix_hit_requests_total,
        prefix_hit_rate_tokens=_rate(stats.prefix_hit_tokens_total, stats.prompt_tokens_total),
        prefix_hit_rate_requests=_rate(stats.prefix_hit_requests_total, stats.requests_total),
        offloads_total=stats.offloads_total, offloaded_bytes_total=stats.offloaded_bytes_total,
        offloaded_remote_bytes_total=stats.offloaded_remote_bytes_total, resumes_total=stats.resumes_total,
        recomputes_total=stats.recomputes_total, offload_host_bytes_used=stats.offload_host_bytes_used,
        admission_policy=stats.admission_policy, admission_headroom_blocks=stats.admission_headroom_blocks,
        new_token_ratio=stats.new_token_ratio,
        address=address, role=role, healthy=healthy, block_size=stats.block_size, blocks_total=stats.blocks_total,
        blocks_free=stats.blocks_free, blocks_reserved=stats.blocks_reserved, blocks_cached=stats.blocks_cached,
        requests_running=stats.requests_running, requests_waiting=stats.requests_waiting,
        preemptions_total=stats.preemptions_total, prefix_hit_tokens_total=stats.prefix_hit_tokens_total,
        prompt_tokens_total=stats.prompt_tokens_total, evictions_total=stats.evictions_total,
        bytes_total=stats.kv_bytes_total, store_fetched_bytes_total=stats.store_fetched_bytes_total,
        store_written_blocks_total=stats.store_written_blocks_total, handovers_out_total=stats.handovers_out_total,
        handovers_in_total=stats.handovers_in_total, kv_layout_id=layout_id(kv_layout(stats.kv_layout)),
        store_breaker_trips_total=stats.store_breaker_trips_total,
        model_name=stats.model_name, weights_digest=stats.weights_digest, deterministic=stats.deterministic,
        state_checkpoints_total=stats.state_checkpoints_total, state_checkpoints_used=stats.state_checkpoints_used,
        state_checkpoint_saves_total=stats.state_checkpoint_saves_total,
        state_checkpoint_hits_total=stats.state_checkpoint_hits_total, state_bytes_total=stats.state_bytes_total,
    )


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0
