"""Concurrent prepare on the prefill node, isolated per decode node (DESIGN.md section 3), with real
processes: one prefill node, a decode node with room ("free") and one whose whole pool is reserved
("full"). Requests that can only go to the full node wait in its queue on the prefill node until their
deadline (RESOURCE_EXHAUSTED) and do not hold up the requests bound for the free node, which are served
while they wait; nothing leaks. (How much they slow each other is printed, not asserted: timings on a
shared 2-core machine are a benchmark's business; docs/benchmarks.md records them.)"""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import pytest
from pdserve.v1 import decode_pb2, decode_pb2_grpc, gateway_pb2, node_pb2, prefill_pb2, prefill_pb2_grpc

from services.common.launch import launch
from services.common.tls.channels import open_sync_channel
from tests.e2e.conftest import ENGINE_ARGS, is_idle

pytestmark = pytest.mark.slow
PROMPT_LEN = 256  # one prefill chunk (ENGINE_ARGS: --max-num-batched-tokens 256)
FULL_BLOCKS = 8
STUCK = 8  # requests for the full node only: 2 Reserve calls in flight, the others queued
STUCK_TIMEOUT_S = 8.0  # at least: longer where the baseline says the measured prefills need more (see the test)
MEASURED = 3
PREFILL_ARGS = (*ENGINE_ARGS, "--prepare-concurrency", "2")
FULL_ARGS = (*ENGINE_ARGS, "--num-kv-blocks", str(FULL_BLOCKS), "--lease-ms", "120000")


@pytest.fixture(scope="module")
def nodes():
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str):
            return stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL,
                                              wait=False))

        prefill, free, full = (start("services.prefill_node", *PREFILL_ARGS),
                               start("services.decode_node", *ENGINE_ARGS), start("services.decode_node", *FULL_ARGS))
        for node in (prefill, free, full):
            node.wait_serving(120)
        yield prefill.address, free.address, full.address


_prompts = random.Random(7)


def fresh_prompt(length: int = PROMPT_LEN) -> list[int]:
    """Random token ids: no prefix shared with any other request, so no cache hit anywhere."""
    return [_prompts.randrange(1000, 40000) for _ in range(length)]


def prefill(address: str, request_id: str, candidates: list[str], timeout_s: float = 60.0,
            length: int = PROMPT_LEN) -> tuple[float, list[prefill_pb2.PrefillEvent]]:
    """Call PrefillNode.Prefill directly; (seconds to the first_token event, all events)."""
    request = prefill_pb2.PrefillRequest(
        request_id=request_id, prompt_token_ids=fresh_prompt(length), decode_candidates=candidates,
        sampling=gateway_pb2.SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    with open_sync_channel(address, "prefill") as channel:
        started = time.monotonic()
        ttft, events = float("nan"), []
        for event in prefill_pb2_grpc.PrefillNodeStub(channel).Prefill(request, timeout=timeout_s):
            if event.HasField("first_token"):
                ttft = time.monotonic() - started
            events.append(event)
    return ttft, events


def status(address: str, stub_class=decode_pb2_grpc.DecodeNodeStub) -> gateway_pb2.NodeStatus:
    role = "prefill" if stub_class is prefill_pb2_grpc.PrefillNodeStub else "decode"
    with open_sync_channel(address, role) as channel:
        return stub_class(channel).NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)


def stuck_request(address: str, full: str, i: int, timeout_s: float) -> tuple[grpc.StatusCode | None, str, float]:
    started = time.monotonic()
    try:
        prefill(address, f"stuck-{i}", [full], timeout_s=timeout_s, length=64)  # would fit an empty pool
    except grpc.RpcError as exc:
        return exc.code(), exc.details(), time.monotonic() - started
    return None, "", time.monotonic() - started


def test_requests_waiting_for_a_full_decode_node_do_not_slow_the_others(nodes):
    p, free, full = nodes
    with open_sync_channel(full, "decode") as channel:
        full_stub = decode_pb2_grpc.DecodeNodeStub(channel)
        filler = full_stub.Reserve(decode_pb2.ReserveRequest(
            request_id="filler", prompt_token_ids=fresh_prompt(FULL_BLOCKS * 16 - 8), max_tokens=1,
            lease_ms=120_000), timeout=10)
        assert filler.granted, filler.reason
        assert status(full).blocks_free == 0

        prefill(p, "warm-up", [free])
        baseline = [prefill(p, f"base-{i}", [free])[0] for i in range(MEASURED)]
        # the stuck requests must outlast the prefills measured beside them, each up to 1.5 times its baseline under
        # load, and a margin (8 s for six of them left ~1.2x on a loaded CI machine, whose baseline is ~1 s)
        stuck_timeout_s = max(STUCK_TIMEOUT_S, 3.0 + 1.5 * (MEASURED + 1) * max(baseline))

        with ThreadPoolExecutor(STUCK) as pool:
            stuck: list[Future] = [pool.submit(stuck_request, p, full, i, stuck_timeout_s) for i in range(STUCK)]
            deadline = time.monotonic() + 5
            while status(p, prefill_pb2_grpc.PrefillNodeStub).requests_waiting < STUCK:
                assert time.monotonic() < deadline, [f.result() for f in stuck if f.done()]
                time.sleep(0.02)
            loaded = []
            for i in range(MEASURED):
                ttft, events = prefill(p, f"loaded-{i}", [free])
                assert [e.WhichOneof("event") for e in events] == ["reserved", "first_token", "done"]
                loaded.append(ttft)
            _, events = prefill(p, "either", [full, free])  # full refuses at once (or its queue is busy)
            reserved = [e.reserved.decode_address for e in events if e.HasField("reserved")]
            assert reserved == [free] and all(e.refused.decode_address == full for e in events if e.HasField("refused"))
            assert status(p, prefill_pb2_grpc.PrefillNodeStub).requests_waiting >= STUCK, "measured without load"
            # Behaviour, not speed (that is bench-admission's): every request for the free node was served
            # while all the stuck ones still waited; queued behind them it would have waited for their deadline.
            assert not any(f.done() for f in stuck), "the stuck requests ended before the others were measured"
            outcomes = [f.result() for f in stuck]

        print(f"TTFT baseline {[round(t * 1000) for t in baseline]} ms, "
              f"with {STUCK} requests waiting for the full node {[round(t * 1000) for t in loaded]} ms")
        assert max(loaded) < stuck_timeout_s / 2, (baseline, loaded)
        for code, details, elapsed in outcomes:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
            assert full in details and "no room" in details, details
            # they waited to the end of their time; the answer left the node before their deadline (the
            # code is not DEADLINE_EXCEEDED), though on a busy machine it may be read a little after it
            assert elapsed >= stuck_timeout_s - 0.5, elapsed

        full_stub.Abort(node_pb2.AbortRequest(request_id="filler", reason="test"), timeout=5)
    deadline = time.monotonic() + 20
    while not all(is_idle(s) for s in (status(free), status(full), status(p, prefill_pb2_grpc.PrefillNodeStub))):
        assert time.monotonic() < deadline, [status(free), status(full), status(p, prefill_pb2_grpc.PrefillNodeStub)]
        time.sleep(0.1)
