"""Client-facing error texts: internal addresses replaced, everything else kept."""

from __future__ import annotations

import time

import pytest

from services.common.errors import UnavailableError
from services.gateway.openai.errors import from_gateway
from services.gateway.redaction import redact_addresses


@pytest.mark.parametrize(("text", "expected"), [
    ("decode node 10.0.3.7:50051 failed: UNAVAILABLE: ipv4:10.0.3.7:50051: Connection refused",
     "decode node [internal] failed: UNAVAILABLE: [internal]: Connection refused"),
    ("prefill node [fd00::1]:7000: stream ended", "prefill node [internal]: stream ended"),
    ("decode-0.decode.pdserve.svc.cluster.local:50051 refused", "[internal] refused"),
    ("dns:///decode.pdserve:50051 and localhost:1234", "[internal] and [internal]"),
    # gRPC's own text for an IPv6 target that refused (what a prefill node's error carries)
    ("[::1]:1: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: ipv6:%5B::1%5D:1: "
     "Failed to connect to remote host: Connection refused",
     "[internal]: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: [internal]: "
     "Failed to connect to remote host: Connection refused"),
    ("fd00::7:50051 refused, 2001:db8:0:0:0:0:2:1:50051 too", "[internal] refused, [internal] too"),
    ("decode-0:50051 and cache-store:50055 refused", "[internal] and [internal] refused"),
])
def test_addresses_are_replaced(text, expected):
    assert redact_addresses(text) == expected


@pytest.mark.parametrize("text", [
    "max_tokens: 16 is larger than max_model_len - prompt (12)",
    "request_id: at most 224 printable characters",
    "the engine failed: RuntimeError: boom at step 3",
    "prompt: 4097 tokens > 4096",
    "UNAVAILABLE:14 at 12:30:45, seq:5, seq:50, attempt:12, x~retry1-abc123:12",
])
def test_other_texts_are_unchanged(text):
    assert redact_addresses(text) == text


def test_the_http_front_redacts_too():
    error = from_gateway(UnavailableError("decode node 127.0.0.1:40001 failed: UNAVAILABLE"))
    assert error.detail.message == "decode node [internal] failed: UNAVAILABLE"


@pytest.mark.parametrize("text", [":" * 65536, "a::" * 21845, "[" + ":" * 65536, "%5B" + ":" * 30000, "ab" * 32768,
                                  "a." * 32768, "1:" * 32768, ("x" * 63 + ".") * 1000])
def test_client_text_cannot_make_it_backtrack(text):
    """Error texts carry client input (a grammar's line, up to 64 KiB): 4,000 colons once took 99 s of the
    event loop. Every pattern now costs O(1) per position."""
    started = time.perf_counter()
    redact_addresses(text)
    assert time.perf_counter() - started < 1.0  # ~10 ms here
