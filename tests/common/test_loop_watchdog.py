"""The event-loop watchdog: a stall (the loop did not run past the threshold) is counted, logged and told
to callers for a while after; a lost node call that comes out of the gateway's own stall is not blamed on
the node."""

from __future__ import annotations

import asyncio
import time

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry

from services.common.loop_watchdog import LoopWatchdog, StallCollector
from services.gateway.legs import Leg, leg_failure


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_late_wake_up_is_a_stall_told_for_a_while_after():
    clock = FakeClock()
    watchdog = LoopWatchdog(interval_s=0.1, threshold_s=1.0, clock=clock)
    clock.now += 0.1 + 0.9  # late, but within the threshold
    watchdog.tick()
    assert watchdog.stalls_total == 0 and watchdog.recent_stall_s() == 0.0
    clock.now += 0.1 + 5.0
    watchdog.tick()
    assert watchdog.stalls_total == 1 and abs(watchdog.stalled_seconds_total - 5.0) < 1e-9
    assert abs(watchdog.recent_stall_s(within_s=2.0) - 5.0) < 1e-9
    clock.now += 2.5
    assert watchdog.recent_stall_s(within_s=2.0) == 0.0
    registry = CollectorRegistry()
    registry.register(StallCollector(watchdog))
    assert registry.get_sample_value("pdserve_event_loop_stalls_total") == 1
    assert registry.get_sample_value("pdserve_event_loop_stalled_seconds_total") == watchdog.stalled_seconds_total


async def test_a_loop_held_by_a_blocking_call_is_seen_as_it_happens_and_after():
    watchdog = LoopWatchdog(interval_s=0.05, threshold_s=0.5)
    watchdog.start()
    try:
        await asyncio.sleep(0.1)
        time.sleep(1.0)  # the loop stands still
        assert watchdog.recent_stall_s() >= 0.9  # the watchdog has not woken yet: a stall in progress
        await asyncio.sleep(0.2)
        assert watchdog.stalls_total >= 1 and watchdog.recent_stall_s() >= 0.9
    finally:
        watchdog.stop()


class Directory:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def mark_failed(self, address: str, reason: str) -> None:
        self.failed.append(address)


def lost(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_a_call_lost_out_of_the_gateways_own_stall_does_not_blame_the_node():
    directory = Directory()
    leg = Leg("decode", "127.0.0.1:7", call=None, request_id="r", stalled_s=20.3)
    error = leg_failure(leg, lost("ping timeout"), directory)  # type: ignore[arg-type]
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert str(error).startswith("lost the call to decode node 127.0.0.1:7 while this gateway stood still for "
                                 "20.3 s") and "ping timeout" in str(error)
    assert directory.failed == []
    for stalled_s in (0.0, 2.0):  # none, or too short for keepalive (5 s) to have given up: the node's doing
        leg.stalled_s = stalled_s
        error = leg_failure(leg, lost("ping timeout"), directory)  # type: ignore[arg-type]
        assert str(error) == "decode node 127.0.0.1:7 failed: UNAVAILABLE: ping timeout"
    assert directory.failed == ["127.0.0.1:7"] * 2
