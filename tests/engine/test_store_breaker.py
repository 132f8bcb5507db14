"""A cache-store that stops answering costs the engine one call's timeout, not one per queued call: the
breaker fails the calls queued behind the first failure fast (a preempted request's fetch does not wait
behind hung puts), keeps new victims in host memory or recomputes them, and tries the store again after
its cooldown. Answers that show a working store (NOT_FOUND) leave it closed. Fake clock and store."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch

from kvcache.kv_bytes import bytes_per_block
from services.cache_store.breaker import StoreBreaker, StoreUnavailable
from services.engine.kv_offload import KVOffload
from services.engine.step_batch import SwapOut
from services.engine_node.remote_store import BreakerRemoteStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FlakyStore:
    """Stores blocks in memory; once ``down`` is set, every call reaches it, waits a little and fails with
    DEADLINE_EXCEEDED, as a hung cache-store's calls do after the client's timeout."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}
        self.down = threading.Event()
        self.calls_while_down: list[str] = []  # puts and gets (deletes run on a thread of their own)
        self.deleted: list[bytes] = []

    def _answer(self, name: str) -> None:
        if self.down.is_set():
            if name != "delete":
                self.calls_while_down.append(name)
            threading.Event().wait(0.05)
            raise Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def put(self, blocks):
        self._answer("put")
        self.blocks.update((key, bytes(data)) for key, data in blocks)

    def get(self, keys, *, restore):
        self._answer("get")
        return [self.blocks[key] for key in keys]

    def delete(self, keys):
        self._answer("delete")
        self.deleted += keys
        return sum(self.blocks.pop(key, None) is not None for key in keys)


def test_calls_queued_behind_a_hung_store_fail_fast_and_victims_stay_home_until_the_cooldown_ends():
    kv_cache = torch.arange(2 * 16 * 4, dtype=torch.float32).reshape(2, 16, 4)
    block = bytes_per_block(kv_cache)
    store, clock = FlakyStore(), Clock()
    offload = KVOffload(block, host_budget_bytes=2 * block, remote_first=True,
                        remote=BreakerRemoteStore(store, StoreBreaker(cooldown_s=10.0, clock=clock)))
    try:
        assert offload.claim("stored", 2)
        offload.copy_out(kv_cache, [SwapOut("stored", (0, 1))])
        offload.wait_io()
        offload.reclaim()  # only the cache-store holds it now
        stored_keys = offload.remote_keys("stored")
        assert stored_keys is not None and offload.ready("stored") is False

        store.down.set()
        for name, blocks in (("a", (2, 3)), ("b", (4, 5)), ("c", (6, 7))):
            assert offload.claim(name, 2)  # the store has not failed yet: bound for it
            offload.copy_out(kv_cache, [SwapOut(name, blocks)])
        offload.prefetch("stored")  # queued behind the three puts
        offload.wait_io()

        assert store.calls_while_down == ["put"]  # the first put's failure stopped the rest at the door
        assert offload.ready("stored") is None  # its fetch failed fast: the request is recomputed
        assert offload.stats.lost_total == 1
        assert all(offload.ready(name) for name in "abc")  # failed puts: their bytes are still here
        assert offload.remote.breaker.trips_total == 1

        assert offload.claim("d", 2) and offload.remote_keys("d") is None  # the host budget has room: kept
        assert offload.host_bytes_used == 2 * block
        assert not offload.claim("e", 2)  # no host room and the store is down: recomputed, nothing staged
        assert store.calls_while_down == ["put"]

        offload.wait_io()
        store.down.clear()  # the store answers again; the breaker stays open until its cooldown ends
        keys_of = {name: list(offload._copies[name].keys) for name in "abc"}
        for name in "abc":
            offload.discard(name)
        offload.wait_io()
        assert store.deleted == [] and store.calls_while_down == ["put"]  # deletes wait for the store

        clock.now += 10.0  # the cooldown ends: the store is tried again
        assert offload.claim("f", 2)
        offload.copy_out(kv_cache, [SwapOut("f", (8, 9))])
        offload.wait_io()
        offload_keys_f = offload.remote_keys("f")
        assert offload_keys_f is not None
        offload.discard("f")
        offload.wait_io()
        # the waiting deletes went with f's: the copies "stored" and "a" (whose put timed out: it may have
        # landed); "b" and "c" never reached the store
        assert set(store.deleted) == {*stored_keys, *keys_of["a"], *offload_keys_f}
    finally:
        offload.close()


def test_the_breaker_opens_on_store_faults_only_and_says_why():
    clock = Clock()
    breaker = StoreBreaker(cooldown_s=5.0, clock=clock)

    def fail(code: grpc.StatusCode):
        raise Status(code, "boom")

    with pytest.raises(grpc.RpcError):
        breaker.call(fail, grpc.StatusCode.NOT_FOUND)  # the store answered: a copy aged out
    with pytest.raises(grpc.RpcError):
        breaker.call(fail, grpc.StatusCode.INVALID_ARGUMENT)
    assert not breaker.is_open() and breaker.call(lambda: 7) == 7

    with pytest.raises(grpc.RpcError):
        breaker.call(fail, grpc.StatusCode.UNAVAILABLE)
    assert breaker.is_open() and breaker.trips_total == 1
    clock.now += 2.0
    called = []
    with pytest.raises(StoreUnavailable, match=r"failed 2\.0 s ago \(UNAVAILABLE: boom\).*again in 3\.0 s"):
        breaker.call(called.append, 1)
    assert called == []

    clock.now += 3.0  # cooldown over: one call goes through
    assert not breaker.is_open() and breaker.call(lambda: "ok") == "ok"
    with pytest.raises(ConnectionRefusedError):
        breaker.call(lambda: (_ for _ in ()).throw(ConnectionRefusedError("refused")))
    assert breaker.is_open() and breaker.trips_total == 2


def test_after_the_cooldown_one_test_call_goes_through_and_its_answer_decides():
    """A store that stays hung costs one timeout per cooldown, not one per call waiting after it."""
    import asyncio

    clock = Clock()
    breaker = StoreBreaker(cooldown_s=5.0, clock=clock)
    breaker.failed(Status(grpc.StatusCode.DEADLINE_EXCEEDED))
    clock.now += 5.0
    assert not breaker.is_open()  # the next call may test the store
    answering, release = threading.Event(), threading.Event()

    def hung_then(result: str) -> str:
        answering.set()
        release.wait(5)
        return result

    tester = threading.Thread(target=breaker.call, args=(hung_then, "answered"))
    tester.start()
    answering.wait(5)
    assert breaker.is_open()  # the test call is out: the others still fail fast
    with pytest.raises(StoreUnavailable, match="a test call to it is in flight"):
        breaker.call(lambda: "not sent")
    release.set()
    tester.join(5)
    assert not breaker.is_open() and breaker.call(lambda: "sent") == "sent"  # it answered: closed

    def timed_out():
        raise Status(grpc.StatusCode.DEADLINE_EXCEEDED)

    with pytest.raises(grpc.RpcError):
        breaker.call(timed_out)
    clock.now += 5.0
    with pytest.raises(grpc.RpcError):
        breaker.call(timed_out)  # the test call failed: open for another cooldown, not a new trip
    assert breaker.is_open() and breaker.trips_total == 2

    async def cancelled_test_call():
        clock.now += 5.0
        task = asyncio.ensure_future(breaker.call_async(asyncio.sleep, 10))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await breaker.call_async(asyncio.sleep, 0, "tested")  # the next call gets the turn

    assert asyncio.run(cancelled_test_call()) == "tested" and not breaker.is_open()


def test_parked_deletes_go_once_the_store_answers_though_nothing_else_is_sent(monkeypatch):
    """An idle node sends no new delete: the parked ones are retried on a timer. A delete that was in flight
    when the store failed is parked too, not dropped (both left copies in the store for good)."""
    monkeypatch.setattr("services.engine.kv_offload.PARKED_RETRY_S", 0.05)
    kv_cache = torch.arange(2 * 16 * 4, dtype=torch.float32).reshape(2, 16, 4)
    store = FlakyStore()
    offload = KVOffload(bytes_per_block(kv_cache), host_budget_bytes=0, remote_first=True,
                        remote=BreakerRemoteStore(store, StoreBreaker(cooldown_s=0.2)))
    try:
        for name, blocks in (("early", (0, 1)), ("late", (2, 3))):
            assert offload.claim(name, 2)
            offload.copy_out(kv_cache, [SwapOut(name, blocks)])
        offload.wait_io()
        keys = {name: offload.remote_keys(name) for name in ("early", "late")}
        assert all(keys.values()) and len(store.blocks) == 4

        store.down.set()
        offload.discard("early")  # in flight when the store fails: its delete times out
        offload.wait_io()
        assert offload.remote.breaker.is_open() and store.blocks.keys() >= set(keys["early"])
        offload.discard("late")  # the breaker is open: parked
        offload.wait_io()
        store.down.clear()
        for _ in range(200):  # no other call is made: the timer sends both after the cooldown
            if not store.blocks:
                break
            threading.Event().wait(0.02)
        assert store.blocks == {} and set(store.deleted) == {*keys["early"], *keys["late"]}
    finally:
        offload.close()


def test_the_retry_timer_rearms_until_the_store_answers_and_stops_at_close(monkeypatch):
    """Each retry that finds the breaker still open arms the next (a timer that checked whether the last was
    still alive could miss it and leave the deletes parked); after close none is armed."""
    monkeypatch.setattr("services.engine.kv_offload.PARKED_RETRY_S", 0.01)
    kv_cache = torch.arange(2 * 16 * 4, dtype=torch.float32).reshape(2, 16, 4)
    store, clock = FlakyStore(), Clock()
    offload = KVOffload(bytes_per_block(kv_cache), host_budget_bytes=0, remote_first=True,
                        remote=BreakerRemoteStore(store, StoreBreaker(cooldown_s=10.0, clock=clock)))
    assert offload.claim("a", 2)
    offload.copy_out(kv_cache, [SwapOut("a", (0, 1))])
    offload.wait_io()
    keys = offload.remote_keys("a")
    store.down.set()
    offload.discard("a")  # times out: parked, the breaker open on the fake clock
    offload.wait_io()
    store.down.clear()
    threading.Event().wait(0.3)  # ~30 retries find the breaker open; each arms the next
    assert offload._parked and _armed_soon(offload)  # (between a firing and its send none is armed)
    clock.now += 10.0  # the cooldown ends: the next retry sends it
    for _ in range(200):
        if not offload._parked:
            break
        threading.Event().wait(0.01)
    assert not offload._parked and set(store.deleted) == set(keys)
    assert offload.claim("b", 2)
    offload.copy_out(kv_cache, [SwapOut("b", (2, 3))])
    offload.wait_io()
    store.down.set()
    offload.discard("b")  # parked again, a timer armed
    offload.wait_io()
    assert offload._parked and _armed_soon(offload)
    offload.close()
    timer = offload._retry  # the one armed when close ran (None if it had just fired): cancelled
    if timer is not None:
        timer.join(1)
        assert not timer.is_alive()
    threading.Event().wait(0.05)
    assert offload._retry is timer  # none armed after close


def _armed_soon(offload: KVOffload) -> bool:
    """A retry timer is armed within a second: one that fired has queued a send, which re-arms it while the
    breaker is open (the bug this guards: a firing that never re-armed left the deletes parked for good)."""
    for _ in range(200):
        if offload._retry is not None:
            return True
        threading.Event().wait(0.005)
    return False
