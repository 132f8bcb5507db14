"""Where a benchmark's CPU goes, thread by thread, and pinning a running process to some CPUs (Linux ``/proc``).

:func:`thread_cpu` reads every thread's CPU time from ``/proc/PID/task/TID/schedstat`` (nanoseconds, not the
10 ms ticks of ``stat``) and sums it by kind: ``python`` (the threads CPython and torch start, named after the
process) and ``grpc`` (gRPC's own threads: ``event_engine``, timers). :func:`cpu_between` is the difference
of two readings. :func:`pin` moves every thread a process has now to ``cpus``; threads it starts later
inherit the affinity of the thread that starts them.
"""

from __future__ import annotations

import os
from collections import Counter

GRPC_THREAD_PREFIXES = ("event_engine", "grpc_", "lifeguard")


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []


def _kind(name: str) -> str:
    return "grpc" if name.startswith(GRPC_THREAD_PREFIXES) else "python"


def thread_cpu(pid: int) -> dict[tuple[str, str], float]:
    """CPU seconds of each live thread of ``pid`` so far, keyed by (thread id, kind)."""
    seconds = {}
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stat, open(f"/proc/{pid}/task/{tid}/comm") as comm:
                seconds[(tid, _kind(comm.read().strip()))] = int(stat.read().split()[0]) / 1e9
        except (FileNotFoundError, ProcessLookupError):  # the thread ended between listing and reading
            continue
    return seconds


def cpu_between(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[str, float]:
    """CPU seconds spent by kind between two :func:`thread_cpu` readings (threads that ended in between are
    not counted: a benchmark reads around work done by long-lived threads)."""
    spent: Counter[str] = Counter({"python": 0.0, "grpc": 0.0})
    for key, seconds in after.items():
        spent[key[1]] += seconds - before.get(key, 0.0)
    return dict(spent)


def pin(pid: int, cpus: set[int]) -> None:
    """Every current thread of ``pid`` runs on ``cpus`` only."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            continue
