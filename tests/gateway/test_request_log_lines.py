"""What an operator reads in the gateway's log about each request: one line when it finishes, with its TTFT,
duration, tokens and nodes; one line when it is rejected, with the field and the reason but never the
body; failures and cancellations with their duration."""

from __future__ import annotations

import structlog

from tests.gateway.test_generate import collect, failure, request


async def test_a_finished_request_logs_ttft_duration_and_tokens(cluster):
    with structlog.testing.capture_logs() as logs:
        responses = await collect(cluster, request("Hello there", max_tokens=5))
    (line,) = [entry for entry in logs if entry["event"] == "request finished"]
    assert line["request_id"] and line["completion_tokens"] == sum(len(r.token_ids) for r in responses)
    assert line["prompt_tokens"] > 0 and line["finish_reason"] == responses[-1].finish_reason
    assert 0 <= line["ttft_ms"] <= line["duration_ms"]
    assert line["prefill_node"] == cluster.p.address and line["decode_node"] == cluster.d.address


async def test_a_rejected_request_logs_the_field_and_reason_without_the_body(cluster):
    body = "word " * 80
    with structlog.testing.capture_logs() as logs:
        error = await failure(cluster, request(body, max_tokens=5, top_p=7.0))
    (line,) = [entry for entry in logs if entry["event"] == "request rejected"]
    assert line["field"] in error.details() and "top_p" in line["field"]
    assert len(str(line)) < 1000 and "word word" not in str(line)
