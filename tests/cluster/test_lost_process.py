"""The launcher (``python -m services.cluster``, ``make run``) does not run on without a process: one that
exits is named with its exit status, and the launcher stops and exits 1. Real processes: two cache-stores
(no model to load) stand in for the cluster's."""

from __future__ import annotations

import signal
import threading

from services.cluster.__main__ import run_until_stopped
from services.cluster.local import LocalCluster
from services.common.launch import launch


def test_a_killed_process_is_reported_and_the_launcher_exits_1(capsys):
    with launch("services.cache_store") as first, launch("services.cache_store") as second:
        cluster = LocalCluster(gateway=first, cache_store=second)
        stop = threading.Event()
        assert cluster.lost() == []
        second.process.send_signal(signal.SIGKILL)
        assert run_until_stopped(cluster, stop, poll_s=0.05) == 1
        assert cluster.lost() == [f"cache-store ({second.address}) was killed by SIGKILL"]
        assert first.process.poll() is None  # stopping the rest is the with-block's (start_cluster's) job
    reported = capsys.readouterr().err
    assert f"error: cache-store ({second.address}) was killed by SIGKILL; stopping the cluster" in reported


def test_an_exit_code_is_named_and_ctrl_c_still_exits_0():
    with launch("services.cache_store") as only:
        cluster = LocalCluster(gateway=only)
        stop = threading.Event()
        stop.set()  # Ctrl-C
        assert run_until_stopped(cluster, stop, poll_s=0.05) == 0
        only.process.send_signal(signal.SIGTERM)  # drains and exits 0
        assert only.process.wait(10) == 0
        assert cluster.lost() == [f"gateway ({only.address}) exited with code 0"]
