"""An engine thread that fails makes the worker unhealthy, and every later call fails with
``EngineStoppedError`` (UNAVAILABLE on the wire) instead of queueing work no step will ever run. A bad
thread count used to kill the thread before its failure was recorded: the node stayed healthy and every
request hung."""

from __future__ import annotations

import asyncio

import pytest

import services.engine_node.node_config  # noqa: F401  (maps the engine's errors to status codes)
from services.common.errors import status_of
from services.engine.errors import EngineStoppedError
from services.engine_node.worker import EngineWorker


class Untouched:
    """The engine: the thread fails before it uses it."""

    def __getattr__(self, name: str):
        raise AssertionError(f"engine.{name} used")

    def close(self) -> None:
        pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
async def test_a_failed_engine_thread_makes_the_worker_unhealthy_and_calls_fail_unavailable():
    worker = EngineWorker(Untouched(), deliver=lambda _: None, num_threads=-2)  # torch refuses -2 threads
    worker.start()
    for _ in range(200):
        if worker.failure is not None:
            break
        await asyncio.sleep(0.01)
    assert isinstance(worker.failure, (RuntimeError, ValueError))
    with pytest.raises(EngineStoppedError, match="engine failed") as raised:
        await worker.call(lambda engine: None)
    assert status_of(raised.value).name == "UNAVAILABLE"
    await worker.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_the_failure_is_handed_to_on_failure_on_the_event_loop():
    loop = asyncio.get_running_loop()
    told: asyncio.Future[tuple[BaseException, asyncio.AbstractEventLoop]] = loop.create_future()
    worker = EngineWorker(Untouched(), deliver=lambda _: None, num_threads=-2,
                          on_failure=lambda exc: told.set_result((exc, asyncio.get_running_loop())))
    worker.start()
    failure, on_loop = await asyncio.wait_for(told, 5)
    assert failure is worker.failure and on_loop is loop
    assert worker.stopped  # a failed worker counts as stopped: nobody waits on it
    await worker.stop()
