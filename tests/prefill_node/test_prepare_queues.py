"""PrepareQueues against fake decode nodes (their Reserve and Abort as functions): isolation per node,
backoff, moving on after prepare_wait, the deadline, RPC errors, cancellation."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from dataclasses import dataclass

import grpc
import grpc.aio
import pytest

from services.common.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnavailableError,
)
from services.prefill_node.prepare import FAILED, UNREACHABLE, PrepareQueues, PrepareSettings, Refused


@dataclass(frozen=True)
class Answer:
    granted: bool
    reason: str = ""
    retry_after_ms: int = 0


class FakeDecodes:
    """Decode nodes by address. ``refuse[address]``: refusals before it grants (None: refuses forever),
    or a callable (elapsed s → refuses?); ``errors[address]``: a status code it fails with;
    ``latency[address]``: seconds a Reserve takes; ``gate[address]``: an event a Reserve waits for
    after the node decided (granted) — as a reply still on the wire."""

    def __init__(self):
        self.refuse: dict[str, object] = {}
        self.errors: dict[str, grpc.StatusCode] = {}
        self.latency: dict[str, float] = defaultdict(float)
        self.gate: dict[str, asyncio.Event] = {}
        self.retry_after_ms = 0
        self.calls: list[tuple[float, str, str]] = []  # (elapsed s, address, request id)
        self.granted: set[tuple[str, str]] = set()  # (address, request id) held on the node
        self.aborts: list[tuple[str, str]] = []
        self.in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight: dict[str, int] = defaultdict(int)
        self.start = asyncio.get_running_loop().time()

    def elapsed(self) -> float:
        return asyncio.get_running_loop().time() - self.start

    def call(self, request_id: str):
        async def reserve(address: str, timeout_s: float) -> Answer:
            assert timeout_s > 0
            self.calls.append((self.elapsed(), address, request_id))
            self.in_flight[address] += 1
            self.max_in_flight[address] = max(self.max_in_flight[address], self.in_flight[address])
            try:
                if self.latency[address] > timeout_s:
                    await asyncio.sleep(timeout_s)
                    raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
                                               grpc.aio.Metadata(), details="Deadline Exceeded")
                await asyncio.sleep(self.latency[address])
                if address in self.errors:
                    raise grpc.aio.AioRpcError(self.errors[address], grpc.aio.Metadata(), grpc.aio.Metadata(),
                                               details="down")
                if self._refuses(address):
                    return Answer(False, f"no room on {address}", self.retry_after_ms)
                self.granted.add((address, request_id))
                if address in self.gate:
                    await self.gate[address].wait()
                return Answer(True)
            finally:
                self.in_flight[address] -= 1
        return reserve

    def _refuses(self, address: str) -> bool:
        rule = self.refuse.get(address, 0)
        if callable(rule):
            return rule(self.elapsed())
        if rule is None:
            return True
        self.refuse[address] = max(0, rule - 1)
        return rule > 0

    def abort(self, request_id: str):
        async def abort(address: str) -> None:
            self.aborts.append((address, request_id))
            self.granted.discard((address, request_id))
        return abort

    def gaps(self, address: str) -> list[float]:
        times = [t for t, a, _ in self.calls if a == address]
        return [b - a for a, b in itertools.pairwise(times)]


def queues(**settings) -> PrepareQueues:
    return PrepareQueues(PrepareSettings(**{"backoff_s": 0.02, "backoff_max_s": 0.5, "wait_s": 0.2, **settings}))


async def reserve(q: PrepareQueues, decodes: FakeDecodes, request_id: str, candidates: list[str],
                  timeout_s: float | None = 2.0):
    return await q.reserve(request_id, candidates, decodes.call(request_id), decodes.abort(request_id), timeout_s)


async def test_a_refusal_moves_to_the_next_candidate_at_once():
    decodes, q = FakeDecodes(), queues()
    decodes.refuse["A"] = None
    result = await reserve(q, decodes, "r", ["A", "B"])
    assert result.address == "B" and result.answer.granted
    assert result.refusals == [Refused("A", "no room on A")]
    assert decodes.elapsed() < 0.05
    assert q.reserve_refusals_total == 1


async def test_a_full_node_delays_no_request_bound_elsewhere():
    """Concurrency 1 per node: ten requests wait in A's queue (A refuses, slowly); requests for B, and for
    [A, B], are granted in about B's latency each."""
    decodes, q = FakeDecodes(), queues(concurrency=1, wait_s=5.0)
    decodes.refuse["A"] = None
    decodes.latency.update(A=0.03, B=0.005)
    stuck = [asyncio.create_task(reserve(q, decodes, f"a{i}", ["A"], timeout_s=1.0)) for i in range(10)]
    await asyncio.sleep(0.1)
    assert q.waiting("A") + q.in_flight("A") == 10 and q.in_flight("A") == 1
    for i in range(5):
        started = decodes.elapsed()
        result = await reserve(q, decodes, f"b{i}", ["B"] if i % 2 else ["A", "B"])
        assert result.address == "B"
        assert decodes.elapsed() - started < 0.05, f"request b{i} took {decodes.elapsed() - started:.3f}s"
    assert q.waiting("B") == q.in_flight("B") == 0
    for task in stuck:
        with pytest.raises(ResourceExhaustedError):
            await task
    assert decodes.max_in_flight["A"] == 1
    assert q.waiting("A") == q.in_flight("A") == 0


async def test_retries_back_off_exponentially_up_to_the_cap_and_report_one_refusal_per_pass():
    decodes, q = FakeDecodes(), queues(backoff_s=0.02, backoff_max_s=0.1)
    decodes.refuse["A"] = 6
    result = await reserve(q, decodes, "r", ["A"])
    assert result.address == "A"
    expected = [0.02, 0.04, 0.08, 0.1, 0.1, 0.1]
    gaps = decodes.gaps("A")
    assert len(gaps) == len(expected)
    for gap, want in zip(gaps, expected, strict=True):
        assert want - 0.005 <= gap <= want + 0.08, (gaps, expected)
    assert [r.decode_address for r in result.refusals] == ["A", "A"]  # the quick pass and one visit
    assert q.reserve_refusals_total == 6


async def test_a_retry_hint_longer_than_the_backoff_is_honoured():
    decodes, q = FakeDecodes(), queues(backoff_s=0.01)
    decodes.refuse["A"], decodes.retry_after_ms = 2, 80
    await reserve(q, decodes, "r", ["A"])
    assert all(gap >= 0.075 for gap in decodes.gaps("A")), decodes.gaps("A")


async def test_a_refusing_node_is_left_after_prepare_wait_and_the_candidates_are_cycled():
    decodes, q = FakeDecodes(), queues(wait_s=0.2)
    decodes.refuse["A"] = None
    decodes.refuse["B"] = lambda elapsed: elapsed < 0.5
    result = await reserve(q, decodes, "r", ["A", "B"])
    assert result.address == "B"
    runs = [address for address, _ in itertools.groupby(a for _, a, _ in decodes.calls)]
    assert runs == ["A", "B", "A", "B", "A", "B"], decodes.calls
    first_b_visit = next(t for t, a, _ in decodes.calls[2:] if a == "B")
    assert first_b_visit >= 0.19
    assert 0.55 <= decodes.elapsed() < 1.0


async def test_the_deadline_ends_in_resource_exhausted_naming_every_node():
    decodes, q = FakeDecodes(), queues(wait_s=0.1, deadline_margin_s=0.05)
    decodes.refuse.update(A=None, B=None)
    with pytest.raises(ResourceExhaustedError) as info:
        await reserve(q, decodes, "late", ["A", "B"], timeout_s=0.5)
    assert 0.44 <= decodes.elapsed() < 0.7
    assert "'late'" in str(info.value) and "A: no room on A" in str(info.value) and "B: no room on B" in str(info.value)
    assert q.waiting("A") == q.waiting("B") == 0


async def test_without_a_caller_deadline_the_default_timeout_applies():
    decodes, q = FakeDecodes(), queues(timeout_s=0.3)
    decodes.refuse["A"] = None
    with pytest.raises(ResourceExhaustedError):
        await reserve(q, decodes, "r", ["A"], timeout_s=None)
    assert 0.29 <= decodes.elapsed() < 0.6


async def test_a_node_failing_with_an_rpc_error_is_skipped_and_all_failing_ends_at_once():
    decodes, q = FakeDecodes(), queues()
    decodes.errors["A"] = grpc.StatusCode.UNAVAILABLE
    decodes.refuse["B"] = 3
    result = await reserve(q, decodes, "r", ["A", "B"])
    assert result.address == "B" and result.refusals[0] == Refused("A", UNREACHABLE)  # gRPC's details: logged
    assert [a for _, a, _ in decodes.calls].count("A") == 1
    decodes.errors["B"] = grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ResourceExhaustedError, match="FAILED_PRECONDITION: down"):
        await reserve(q, decodes, "r2", ["A", "B"], timeout_s=10.0)
    assert q.reserve_errors_total == 3 and not decodes.aborts


async def test_every_node_refusing_the_kv_layout_is_a_failed_precondition_not_a_shortage():
    decodes, q = FakeDecodes(), queues()
    decodes.errors["A"] = decodes.errors["B"] = grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(FailedPreconditionError, match="no decode node can use this prefill node's KV"):
        await reserve(q, decodes, "r", ["A", "B"], timeout_s=10.0)
    decodes.errors["B"] = grpc.StatusCode.UNAVAILABLE  # one node down: perhaps a shortage, worth a retry
    with pytest.raises(ResourceExhaustedError):
        await reserve(q, decodes, "r2", ["A", "B"], timeout_s=10.0)


async def test_no_decode_node_reachable_is_unavailable_not_a_shortage():
    """Every decode node down or restarting (connection refused): the client reads UNAVAILABLE naming them,
    not RESOURCE_EXHAUSTED (a full cluster); one that answers with a refusal keeps it a shortage."""
    decodes, q = FakeDecodes(), queues()
    decodes.errors["A"] = decodes.errors["B"] = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(UnavailableError) as info:
        await reserve(q, decodes, "r", ["A", "B"], timeout_s=10.0)
    assert str(info.value) == f"no decode node could be reached for request 'r': {UNREACHABLE}"  # naming none
    del decodes.errors["B"]
    decodes.refuse["B"] = None
    with pytest.raises(ResourceExhaustedError):
        await reserve(q, decodes, "r2", ["A", "B"], timeout_s=1.0)


async def test_a_request_every_node_refuses_as_invalid_is_invalid_not_a_shortage():
    """Past every decode node's KV pool, say: a 400 for the client, not a 429 that it would retry."""
    decodes, q = FakeDecodes(), queues()
    decodes.errors["A"] = decodes.errors["B"] = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InvalidArgumentError, match="no decode node can take request 'r'"):
        await reserve(q, decodes, "r", ["A", "B"], timeout_s=10.0)
    decodes.errors["B"] = grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(FailedPreconditionError):
        await reserve(q, decodes, "r2", ["A", "B"], timeout_s=10.0)


async def test_a_reserve_that_timed_out_is_aborted_in_case_it_was_granted():
    decodes, q = FakeDecodes(), queues()
    decodes.errors["A"] = grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(ResourceExhaustedError):
        await reserve(q, decodes, "r", ["A"])
    await q.close()
    assert decodes.aborts == [("A", "r")]


async def test_a_reserve_cut_short_by_the_request_deadline_keeps_the_node_s_last_reason():
    decodes, q = FakeDecodes(), queues(deadline_margin_s=0.05)
    decodes.refuse["A"], decodes.latency["A"] = None, 0.15
    with pytest.raises(ResourceExhaustedError) as info:
        await reserve(q, decodes, "r", ["A"], timeout_s=0.5)
    assert 0.44 <= decodes.elapsed() < 0.6
    assert "A: no room on A" in str(info.value) and "DEADLINE" not in str(info.value)
    await q.close()
    assert decodes.aborts == [("A", "r")] and q.reserve_errors_total == 0


async def test_cancelling_frees_the_slot_whether_queued_or_in_flight():
    decodes, q = FakeDecodes(), queues(concurrency=1)
    decodes.gate["A"] = asyncio.Event()  # A grants, but the answer is slow to arrive
    in_flight = asyncio.create_task(reserve(q, decodes, "r1", ["A"]))
    queued = asyncio.create_task(reserve(q, decodes, "r2", ["A"]))
    await asyncio.sleep(0.05)
    assert (q.in_flight("A"), q.waiting("A")) == (1, 1)
    queued.cancel()
    in_flight.cancel()
    await asyncio.gather(queued, in_flight, return_exceptions=True)
    assert (q.in_flight("A"), q.waiting("A")) == (0, 0)
    assert decodes.aborts == []  # not before the answer: an Abort could overtake the Reserve
    decodes.gate["A"].set()
    await q.settled("r1")
    assert decodes.aborts == [("A", "r1")] and not decodes.granted
    await q.close()
    del decodes.gate["A"]
    started = decodes.elapsed()
    assert (await reserve(q, decodes, "r3", ["A"])).address == "A"
    assert decodes.elapsed() - started < 0.05


async def test_a_grant_whose_caller_was_cancelled_right_after_is_aborted():
    decodes, q = FakeDecodes(), queues()
    decodes.gate["A"] = asyncio.Event()
    task = asyncio.create_task(reserve(q, decodes, "r", ["A"]))
    await asyncio.sleep(0.02)
    assert decodes.granted == {("A", "r")}
    decodes.gate["A"].set()  # the grant is on its way back …
    task.cancel()  # … and the caller goes away before it sees it
    with pytest.raises(asyncio.CancelledError):
        await task
    await q.close()
    assert not decodes.granted and decodes.aborts == [("A", "r")]
    assert (q.in_flight("A"), q.waiting("A")) == (0, 0)


async def test_an_in_flight_reserve_refused_after_its_caller_left_is_not_aborted():
    decodes, q = FakeDecodes(), queues()
    decodes.refuse["A"], decodes.latency["A"] = None, 0.1
    task = asyncio.create_task(reserve(q, decodes, "r", ["A"]))
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await q.settled("r")
    assert len(decodes.calls) == 1 and decodes.aborts == []


async def test_backoff_sleeps_hold_no_slot():
    """Concurrency 1 and two requests refused by A: while one backs off the other is asked."""
    decodes, q = FakeDecodes(), queues(concurrency=1, backoff_s=0.1, backoff_max_s=0.1)
    decodes.refuse["A"] = lambda elapsed: elapsed < 0.25
    results = await asyncio.gather(*(reserve(q, decodes, f"r{i}", ["A"]) for i in range(2)))
    assert {r.address for r in results} == {"A"}
    firsts = {rid: next(t for t, _, r in decodes.calls if r == rid) for rid in ("r0", "r1")}
    assert max(firsts.values()) < 0.05, decodes.calls  # r1 did not wait out r0's backoff


async def test_a_caller_reads_nothing_of_a_candidate_s_rpc_error_but_the_answers_of_a_decode_node():
    """Which candidate was down, silent, not a decode node or broken is this node's log's business: the
    caller reads one reason for the unreachable (UNIMPLEMENTED: no DecodeNode there, counted as
    unreachable) and one for other failures; a decode node's answer about the request stays as it is."""
    decodes, q = FakeDecodes(), queues()
    decodes.errors.update(A=grpc.StatusCode.UNAVAILABLE, B=grpc.StatusCode.UNIMPLEMENTED,
                          C=grpc.StatusCode.INTERNAL, D=grpc.StatusCode.FAILED_PRECONDITION)
    result = await reserve(q, decodes, "r", ["A", "B", "C", "D", "E"], timeout_s=10.0)
    assert result.address == "E"
    assert result.refusals == [Refused("A", UNREACHABLE), Refused("B", UNREACHABLE), Refused("C", FAILED),
                               Refused("D", "FAILED_PRECONDITION: down")]
    with pytest.raises(UnavailableError) as info:  # unreachable, however: UNAVAILABLE (the gateway retries)
        await reserve(q, decodes, "r2", ["A", "B"], timeout_s=10.0)
    assert str(info.value) == f"no decode node could be reached for request 'r2': {UNREACHABLE}"


async def test_a_queue_is_dropped_once_idle():
    """Callers name any addresses: none is kept once nobody tries it (waiting, backing off, in a call)."""
    decodes, q = FakeDecodes(), queues(concurrency=1)
    decodes.errors["gone"] = grpc.StatusCode.UNAVAILABLE
    decodes.refuse["A"], decodes.latency["A"] = 2, 0.25  # a call long enough to be seen under load
    tasks = [asyncio.create_task(reserve(q, decodes, f"r{i}", ["gone", "A"])) for i in range(4)]
    for _ in range(200):  # until every caller has reached A's queue (polled: a loaded machine is slow)
        if q.waiting("A") == 3:
            break
        await asyncio.sleep(0.005)
    assert q.in_flight("A") == 1 and q.waiting("A") == 3 and "A" in q.waiting_by_node()
    assert {r.address for r in await asyncio.gather(*tasks)} == {"A"}
    assert q._queues == {} and q.waiting_by_node() == {}
    for i in range(20):  # bogus addresses, all failing: nothing accumulates
        decodes.errors[f"bogus-{i}:1"] = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(UnavailableError):
            await reserve(q, decodes, f"x{i}", [f"bogus-{i}:1"], timeout_s=0.5)
    assert q._queues == {}
    decodes.refuse["A"] = None  # refused to the deadline, backing off between tries
    with pytest.raises(ResourceExhaustedError):
        await reserve(q, decodes, "late", ["A"], timeout_s=0.3)
    assert q._queues == {}
    await q.close()
