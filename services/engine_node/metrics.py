"""Prometheus families of a node that runs the model (prefill or decode), from its ``NodeStatus``.

Rendered at scrape time (:class:`services.common.metrics.LoopCollector`) from the same numbers the
``NodeStatus`` rpc reports, so ``/metrics`` and ``ClusterStatus`` never disagree. KV blocks by state sum
to ``pdserve_kv_capacity_blocks``: every block is free, cached (evictable prefix cache), reserved (leased
to a prefill node) or held by a request.
"""

from __future__ import annotations

from collections.abc import Iterator

from pdserve.v1 import gateway_pb2
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.common.kv_transfer_stats import KVTransferStats
from services.common.metrics import counter, gauge, labelled


def engine_node_families(status: gateway_pb2.NodeStatus) -> Iterator[Metric]:
    """Blocks, queues, prefix-cache accounting, preemption and offload of a prefill or decode node."""
    s = status
    held = s.blocks_total - s.blocks_free - s.blocks_cached - s.blocks_reserved
    yield gauge("pdserve_kv_capacity_blocks", "KV blocks in this node's pool", s.blocks_total)
    yield gauge("pdserve_kv_capacity_bytes", "Bytes of this node's KV pool", s.bytes_total)
    yield gauge("pdserve_kv_block_size_tokens", "Tokens per KV block", s.block_size)
    yield labelled(GaugeMetricFamily("pdserve_kv_blocks", "KV blocks by state; the states sum to the capacity",
                                     labels=["state"]),
                   "state", [("free", s.blocks_free), ("cached", s.blocks_cached),
                             ("reserved", s.blocks_reserved), ("held", held)])
    yield gauge("pdserve_requests_running", "Requests in the running batch", s.requests_running)
    yield gauge("pdserve_requests_waiting", "Requests queued (prefill: also those looking for a decode node)",
                s.requests_waiting)
    yield counter("pdserve_admitted_requests_total", "Requests admitted (decode: committed), once each",
                  s.requests_total)
    yield counter("pdserve_prompt_tokens_total", "Prompt tokens of the admitted requests", s.prompt_tokens_total)
    yield counter("pdserve_prefix_hit_tokens_total", "Prompt tokens served from this node's prefix cache",
                  s.prefix_hit_tokens_total)
    yield counter("pdserve_prefix_hit_requests_total", "Admitted requests with at least one cached block",
                  s.prefix_hit_requests_total)
    yield counter("pdserve_prefix_cache_evictions_total", "Cached blocks dropped to make room", s.evictions_total)
    yield counter("pdserve_preemptions_total", "Decode requests preempted under memory pressure",
                  s.preemptions_total)
    yield counter("pdserve_offloads_total", "Preemptions whose KV was copied out instead of dropped",
                  s.offloads_total)
    yield labelled(CounterMetricFamily("pdserve_offloaded_bytes", "Preempted KV bytes copied out, by destination",
                                       labels=["tier"]),
                   "tier", [("host", s.offloaded_bytes_total - s.offloaded_remote_bytes_total),
                            ("cache_store", s.offloaded_remote_bytes_total)])
    yield gauge("pdserve_offload_host_bytes", "Host memory holding preempted KV now", s.offload_host_bytes_used)
    yield counter("pdserve_resumes_total", "Preempted requests resumed from their kept KV", s.resumes_total)
    yield counter("pdserve_recomputes_total", "Preempted requests whose KV was recomputed", s.recomputes_total)
    yield labelled(GaugeMetricFamily("pdserve_state_checkpoints", "A hybrid model's checkpoints of the recurrent "
                                     "state (prefix hits start from them), by state; the states sum to how many it "
                                     "keeps", labels=["state"]),
                   "state", [("used", s.state_checkpoints_used),
                             ("free", s.state_checkpoints_total - s.state_checkpoints_used)])
    yield gauge("pdserve_state_capacity_bytes", "Bytes of a hybrid or state-space model's recurrent states (requests' "
                "slots and checkpoints; a Mamba's KV pool holds none)", s.state_bytes_total)
    yield counter("pdserve_state_checkpoint_saves_total", "Recurrent states saved at a block boundary",
                  s.state_checkpoint_saves_total)
    yield counter("pdserve_state_checkpoint_hits_total", "Requests that started from a saved recurrent state",
                  s.state_checkpoint_hits_total)
    yield gauge("pdserve_admission_headroom_blocks", "Blocks kept free for the running requests now",
                s.admission_headroom_blocks)
    yield gauge("pdserve_admission_new_token_ratio", "The new_token_ratio policy's ratio (0 for others)",
                s.new_token_ratio)
    yield counter("pdserve_store_fetched_bytes_total", "KV bytes read from the cache-store",
                  s.store_fetched_bytes_total)
    yield counter("pdserve_store_written_blocks_total", "KV blocks written to the cache-store",
                  s.store_written_blocks_total)
    yield counter("pdserve_store_breaker_trips_total", "Times the cache-store failed and the engine's calls to it "
                  "failed fast for a cooldown", s.store_breaker_trips_total)


def kv_transfer_families(stats: KVTransferStats, direction: str) -> Iterator[Metric]:
    """``direction``: "sent" (prefill node) or "received" (decode node)."""
    yield counter("pdserve_kv_transfer_bytes_total", "KV bytes moved on TransferKV streams", stats.bytes_total,
                  direction=direction)
    yield counter("pdserve_kv_transfer_blocks_total", "KV blocks moved on TransferKV streams", stats.blocks_total,
                  direction=direction)
    yield counter("pdserve_kv_transfer_seconds_total", "Time spent moving KV on TransferKV streams "
                  "(sent: writes and the commit's acknowledgements; received: taking batches in)",
                  stats.seconds_total, direction=direction)
