"""Fixtures shared by the tests of services.common."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing


@pytest.fixture
def spans():
    """Tracing on for one test, every span kept in memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    assert tracing.setup_tracing("pdserve-test", exporter=exporter)
    yield exporter
    tracing.shutdown_tracing()
