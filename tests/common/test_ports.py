"""Ports chosen by a launcher before a service binds them (``ports.unused_port``): outside the kernel's ephemeral
range, free when chosen; a service that finds its port taken meanwhile is told apart (``PortTaken``) from one that
failed for another reason, and ``start_cluster`` starts again elsewhere."""

from __future__ import annotations

import socket
import subprocess

import pytest

from services.cluster import local
from services.cluster.local import ClusterSpec, start_cluster
from services.common import ports
from services.common.launch import launch
from services.common.ports import PortTaken, StartupError, port_is_free, unused_port


def test_a_chosen_port_is_free_and_outside_the_ephemeral_range():
    low, high = ports.ephemeral_range()
    for _ in range(20):
        port = unused_port()
        assert not low <= port <= high and 10000 <= port <= 65535 and port_is_free("127.0.0.1", port)


def test_with_no_room_outside_the_ephemeral_range_a_port_zero_bind_chooses(monkeypatch):
    chosen = []
    real = ports.free_port
    monkeypatch.setattr(ports, "free_port", lambda host="127.0.0.1": chosen.append(real(host)) or chosen[-1])
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = unused_port()
    assert chosen == [port] and port_is_free("127.0.0.1", port)


def test_a_port_a_launcher_chose_already_is_not_chosen_again(monkeypatch):
    only = ports.free_port()  # room for this one alone outside the ephemeral range
    monkeypatch.setattr(ports, "_CHOSEN_FROM", (only, only))
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, only - 1))
    assert unused_port() == only
    other = unused_port(avoid=[only])  # none left outside: a port 0 bind's
    assert other != only and port_is_free("127.0.0.1", other)


def _held() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", unused_port()))
    holder.listen()
    return holder


def test_a_service_whose_port_was_taken_says_so_and_one_that_fails_otherwise_does_not():
    with _held() as holder:
        port = holder.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
        with launch("services.cache_store", "--log-level", "warning", port=port, wait=False,
                    stderr=subprocess.DEVNULL) as store:
            assert store.address == f"127.0.0.1:{port}"  # known before it serves
            with pytest.raises(PortTaken, match=f"could not bind 127.0.0.1:{port}: another process took it"):
                store.wait_serving(60)
    with launch("services.cache_store", "--capacity-bytes", "-1", port=unused_port(), wait=False,
                stderr=subprocess.DEVNULL) as broken:
        with pytest.raises(StartupError) as failed:
            broken.wait_serving(60)
        assert not isinstance(failed.value, PortTaken)


def test_a_free_given_port_is_served_on():
    port = unused_port()
    with launch("services.cache_store", "--log-level", "warning", port=port) as store:
        assert store.address == f"127.0.0.1:{port}" and not port_is_free("127.0.0.1", port)


def test_a_cluster_whose_chosen_port_was_taken_starts_again(monkeypatch):
    """``start_cluster`` after a :class:`PortTaken`: what the attempt started is stopped (its stack closed) and it
    starts again, up to three times (the real detection is tested above, with a real service)."""
    attempts, closed = [], []

    class Gateway:
        def stop(self):
            closed.append("gateway")

    def attempt(stack, spec, stdout, stderr):
        stack.callback(closed.append, f"attempt {len(attempts) + 1}")
        attempts.append(spec)
        if len(attempts) < 3:
            raise PortTaken("the cache-store could not bind 127.0.0.1:20000: another process took it")
        return local.LocalCluster(Gateway())  # type: ignore[arg-type]

    monkeypatch.setattr(local, "_start", attempt)
    with start_cluster(ClusterSpec()) as cluster:
        assert len(attempts) == 3 and closed == ["attempt 1", "attempt 2"] and cluster.prefill == []
    assert closed == ["attempt 1", "attempt 2", "gateway", "attempt 3"]

    def always_taken(stack, spec, stdout, stderr):
        attempts.append(spec)
        raise PortTaken("taken again")

    attempts.clear()
    monkeypatch.setattr(local, "_start", always_taken)
    with pytest.raises(PortTaken, match="taken again"), start_cluster(ClusterSpec()):
        pass
    assert len(attempts) == 3
