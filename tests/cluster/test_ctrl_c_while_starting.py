"""Ctrl-C while ``make run`` is still starting the cluster stops at once, and stops every process it had started:
the services ignore the terminal's SIGINT (the launcher stops them), so the launcher unwinds its start on the
first Ctrl-C instead of waiting for every node to load, and each process started so far gets its SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from services.common.launch import REPO_ROOT

pytestmark = pytest.mark.slow


def test_ctrl_c_while_starting_stops_every_process_started_so_far():
    command = [sys.executable, "-m", "services.cluster", "--insecure", "--gateway", "127.0.0.1:0", "--http",
               "127.0.0.1:0", "--threads", "1"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True, env={**os.environ, "PDSERVE_LOG_LEVEL": "warning"})
    try:
        assert process.stdout.readline().startswith("starting the cluster")
        time.sleep(1.5)  # the cache-store and the nodes are launching; loading the model takes longer
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: to the whole group
        assert process.wait(timeout=60) == 130
        assert "stopped while starting" in process.stdout.read()
        deadline = time.monotonic() + 30
        while True:  # every process of the group has exited (the services are in the launcher's group)
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "a process the launcher started outlived it"
            time.sleep(0.2)
    finally:
        if process.poll() is None or _group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
