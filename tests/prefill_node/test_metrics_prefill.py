"""The prefill node's /metrics families, rendered from a NodeStatus and its KV send counters (no model)."""

from __future__ import annotations

from pdserve.v1 import gateway_pb2

from services.common.kv_transfer_stats import KVTransferStats
from services.prefill_node.metrics import render


def test_prefill_series_carry_store_hits_and_the_kv_it_sent():
    status = gateway_pb2.NodeStatus(role="prefill", blocks_total=64, blocks_free=60, blocks_cached=4,
                                    store_hit_tokens_total=48, store_fetched_bytes_total=9000,
                                    store_written_blocks_total=7, prefix_hit_tokens_total=32,
                                    state_checkpoints_total=32, state_checkpoints_used=5,
                                    state_checkpoint_saves_total=9, state_checkpoint_hits_total=4,
                                    state_bytes_total=5_000_000)
    sent = KVTransferStats()
    sent.add(368_640, 1, 0.01)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in render((status, sent)) for s in f.samples}
    assert samples[("pdserve_store_hit_tokens_total", ())] == 48
    assert samples[("pdserve_store_fetched_bytes_total", ())] == 9000
    assert samples[("pdserve_store_written_blocks_total", ())] == 7
    assert samples[("pdserve_prefix_hit_tokens_total", ())] == 32
    assert samples[("pdserve_state_checkpoints", (("state", "used"),))] == 5
    assert samples[("pdserve_state_checkpoints", (("state", "free"),))] == 27
    assert samples[("pdserve_state_checkpoint_saves_total", ())] == 9
    assert samples[("pdserve_state_checkpoint_hits_total", ())] == 4
    assert samples[("pdserve_state_capacity_bytes", ())] == 5_000_000
    assert samples[("pdserve_kv_transfer_bytes_total", (("direction", "sent"),))] == 368_640
    assert not any(labels == (("direction", "received"),) for _, labels in samples)
