"""The Prometheus series pdserve really exposes, from the code's own metric families (no process started):
what the chart's autoscaling queries may name."""

from __future__ import annotations

import functools
import re

from pdserve.v1 import gateway_pb2
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from services.engine_node.metrics import engine_node_families
from services.gateway.metrics import GatewayMetrics


class _EngineFamilies(Collector):
    def collect(self):
        return engine_node_families(gateway_pb2.NodeStatus(blocks_total=8, blocks_free=2, blocks_reserved=1))


@functools.cache
def exposition() -> str:
    """The /metrics text of an engine node and a gateway, with one request observed."""
    engine = CollectorRegistry()
    engine.register(_EngineFamilies())
    gateway = CollectorRegistry()
    metrics = GatewayMetrics(gateway)
    metrics.ttft.observe(0.25)
    metrics.in_flight.inc()
    return generate_latest(engine).decode() + generate_latest(gateway).decode()


def series_names() -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in exposition().splitlines() if line and not line.startswith("#")}


def label_values(series: str, label: str) -> set[str]:
    return set(re.findall(rf'^{series}{{[^}}]*{label}="([^"]+)"', exposition(), re.MULTILINE))
