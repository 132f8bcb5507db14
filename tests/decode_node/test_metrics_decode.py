"""The decode node's /metrics families, rendered from a NodeStatus and its KV receive counters (no model)."""

from __future__ import annotations

from pdserve.v1 import gateway_pb2

from services.common.kv_transfer_stats import KVTransferStats
from services.decode_node.metrics import render
from services.decode_node.migration import MigrationStats


def test_decode_series_carry_handovers_and_the_kv_it_received():
    status = gateway_pb2.NodeStatus(role="decode", blocks_total=64, blocks_free=40, blocks_cached=8,
                                    blocks_reserved=6, handovers_out_total=2, handovers_in_total=1,
                                    preemptions_total=3)
    received = KVTransferStats()
    received.add(737_280, 2, 0.02)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in render((status, received, MigrationStats())) for s in f.samples}
    assert samples[("pdserve_handovers_total", (("direction", "out"),))] == 2
    assert samples[("pdserve_handovers_total", (("direction", "in"),))] == 1
    assert samples[("pdserve_kv_transfer_blocks_total", (("direction", "received"),))] == 2
    assert samples[("pdserve_kv_blocks", (("state", "held"),))] == 64 - 40 - 8 - 6
    assert samples[("pdserve_preemptions_total", ())] == 3
