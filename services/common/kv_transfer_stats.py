"""Cumulative counters of the KV moved between prefill and decode nodes, exported as Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KVTransferStats:
    """What one process sent (prefill node) or received (decode node) on ``TransferKV`` streams.

    Updated on the event loop as each block batch goes out or comes in; read at scrape time. ``seconds``:
    on the sending side the time spent writing batches (the stream's flow control included) and waiting
    for the commit's acknowledgements; on the receiving side the time spent taking batches into the
    pool (checks and copy)."""

    bytes_total: int = 0
    blocks_total: int = 0
    seconds_total: float = 0.0

    def add(self, num_bytes: int, num_blocks: int, seconds: float) -> None:
        self.bytes_total += num_bytes
        self.blocks_total += num_blocks
        self.seconds_total += seconds
