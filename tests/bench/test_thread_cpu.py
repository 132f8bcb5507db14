"""The benchmarks' per-thread CPU accounting and pinning (``services/bench/thread_cpu.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import pytest

from services.bench.thread_cpu import cpu_between, pin, thread_cpu


def _spin(seconds: float, halfway: threading.Event | None = None, release: threading.Event | None = None) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    if halfway is not None:
        halfway.set()
        release.wait(10)


def test_cpu_of_a_busy_thread_is_counted_as_python() -> None:
    before = thread_cpu(os.getpid())
    spun, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=_spin, args=(0.1, spun, release))
    worker.start()
    assert spun.wait(30)  # 0.1 s of the worker's own CPU time, however loaded the machine
    during = thread_cpu(os.getpid())  # the worker is alive here: its time is read
    release.set()
    worker.join()
    spent = cpu_between(before, during)
    assert spent["grpc"] >= 0.0
    assert spent["python"] >= 0.09


def test_grpc_threads_are_counted_apart() -> None:
    """A plaintext gRPC channel starts gRPC's own threads; their time lands under ``grpc``."""
    with grpc.insecure_channel("127.0.0.1:1") as channel:  # nothing listens: the connect attempts run
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=0.3)
        kinds = {kind for _, kind in thread_cpu(os.getpid())}
    assert kinds == {"python", "grpc"}


def test_a_thread_that_ended_is_not_counted_negative() -> None:
    before = thread_cpu(os.getpid())
    worker = threading.Thread(target=_spin, args=(0.05,))
    worker.start()
    worker.join()
    spent = cpu_between(before, thread_cpu(os.getpid()))
    assert all(value >= 0 for value in spent.values())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_pin_moves_every_thread_of_a_running_process() -> None:
    script = "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n" \
             "print('up', flush=True)\ntime.sleep(30)\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"up"
        one = {min(os.sched_getaffinity(0))}
        pin(child.pid, one)
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) >= 2
        assert all(os.sched_getaffinity(int(tid)) == one for tid in tids)
    finally:
        child.kill()
        child.wait()


def test_reading_a_process_that_is_gone_gives_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert thread_cpu(child.pid) == {}
    pin(child.pid, set(os.sched_getaffinity(0)))  # nothing to move, no error
