"""What the gateway knows about one node: its address, role, health and last reported counters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PREFILL = "prefill"
DECODE = "decode"
CACHE_STORE = "cache_store"
ROLES = (PREFILL, DECODE, CACHE_STORE)


@dataclass(frozen=True)
class NodeInfo:
    """A node as of its last poll. The counters mirror ``pdserve.v1.NodeStatus``; a node that did not
    answer is unhealthy with zero counters and ``error`` saying why. ``inflight`` counts the requests
    this gateway has routed to the node and not yet finished (fresher than the polled counters)."""

    address: str
    role: str
    healthy: bool = False
    blocks_total: int = 0
    blocks_free: int = 0
    blocks_reserved: int = 0
    blocks_cached: int = 0
    requests_running: int = 0
    requests_waiting: int = 0
    preemptions_total: int = 0
    prefix_hit_tokens_total: int = 0
    prompt_tokens_total: int = 0
    metrics_url: str = ""
    block_size: int = 0
    bytes_total: int = 0
    bytes_used: int = 0
    evictions_total: int = 0
    prefix_hit_blocks_total: int = 0
    requests_total: int = 0
    prefix_hit_requests_total: int = 0
    prefix_hit_rate_tokens: float = 0.0
    prefix_hit_rate_requests: float = 0.0
    offloads_total: int = 0
    offloaded_bytes_total: int = 0
    offloaded_remote_bytes_total: int = 0
    resumes_total: int = 0
    recomputes_total: int = 0
    offload_host_bytes_used: int = 0
    admission_policy: str = ""
    admission_headroom_blocks: int = 0
    new_token_ratio: float = 0.0
    memory_blocks: int = 0
    disk_bytes_total: int = 0
    disk_bytes_used: int = 0
    disk_blocks: int = 0
    hits_total: int = 0
    disk_hits_total: int = 0
    misses_total: int = 0
    memory_evictions_total: int = 0
    disk_evictions_total: int = 0
    store_hit_tokens_total: int = 0
    store_fetched_bytes_total: int = 0
    store_written_blocks_total: int = 0
    handovers_out_total: int = 0
    handovers_in_total: int = 0
    restored_blocks_total: int = 0
    calls_in_flight: int = 0
    disk_write_failures_total: int = 0
    store_breaker_trips_total: int = 0
    kv_layout_id: str = ""  # model nodes: whose KV they can exchange (equal ids); empty = not reported
    model_name: str = ""  # model nodes: the model they serve, by name
    weights_digest: str = ""  # ... and by its weight files' bytes; empty = not reported
    deterministic: bool = False  # model nodes: batch-invariant mode (--deterministic)
    state_checkpoints_total: int = 0  # a hybrid model's nodes: checkpoints of the recurrent state it keeps
    state_checkpoints_used: int = 0
    state_checkpoint_saves_total: int = 0
    state_checkpoint_hits_total: int = 0
    state_bytes_total: int = 0  # a hybrid or state-space model's nodes: the memory of its recurrent states
    error: str = ""
    polled_at: float = 0.0  # time.monotonic() of the poll; 0 = never polled
    inflight: int = 0

    @property
    def load(self) -> int:
        """Requests on the node: what it reported, or what this gateway sent it if that is more."""
        return max(self.requests_running + self.requests_waiting, self.inflight)

    @property
    def available_blocks(self) -> int:
        """Blocks a new reservation can get: free plus evictable cached ones. Reserved blocks are
        already outside ``blocks_free`` (total = free + cached + reserved + held by requests)."""
        return self.blocks_free + self.blocks_cached


STATUS_FIELDS = tuple(f.name for f in dataclasses.fields(NodeInfo)
                      if f.name not in ("address", "role", "error", "polled_at", "inflight"))
"""The fields shared with ``pdserve.v1.NodeStatus`` besides address and role."""
