"""Whether two processes share a host and a GPU, so that one may map the other's KV pool by CUDA IPC.

Plain Python: the identity is read from ``/proc`` (boot id, IPC and PID namespaces, pid) plus the GPU's
UUID, which the caller gets from torch (``kvcache.cuda_ipc.gpu_uuid``). A verdict of "may" is only a
precondition: the IPC probe (a known pattern read through the mapping) has the last word.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostIdentity:
    """Where a process runs. Empty strings mean "could not be read" (a sandbox may hide ``/proc`` parts)."""

    boot_id: str
    """``/proc/sys/kernel/random/boot_id``: the same on every process of one booted kernel."""
    ipc_namespace: str
    """Target of ``/proc/self/ns/ipc``, e.g. ``ipc:[4026531839]``."""
    pid_namespace: str
    """Target of ``/proc/self/ns/pid``."""
    pid: int
    gpu_uuid: str
    """The UUID of the GPU the process's KV pool lives on; empty for a CPU process."""


def read_host_identity(gpu_uuid: str = "", proc: Path = Path("/proc"), pid: int | None = None) -> HostIdentity:
    """This process's identity (``proc``: another root, for tests)."""
    return HostIdentity(
        boot_id=_read(proc / "sys" / "kernel" / "random" / "boot_id"),
        ipc_namespace=_readlink(proc / "self" / "ns" / "ipc"),
        pid_namespace=_readlink(proc / "self" / "ns" / "pid"),
        pid=os.getpid() if pid is None else pid,
        gpu_uuid=gpu_uuid,
    )


def ipc_refusal(local: HostIdentity, peer: HostIdentity) -> str | None:
    """Why the peer's GPU memory cannot be mapped here by CUDA IPC, or None when it may be (then probe).

    Needs: a GPU on both sides, the same booted kernel (boot ids known and equal), the same GPU (UUIDs
    equal), the same IPC and PID namespaces where both sides could read them, and two processes (CUDA
    does not map a process's own allocation through IPC)."""
    if not local.gpu_uuid or not peer.gpu_uuid:
        return "no GPU on " + ("this side" if not local.gpu_uuid else "the peer")
    if not local.boot_id or not peer.boot_id:
        return "boot id unknown: cannot tell whether the peer runs on this host"
    if local.boot_id != peer.boot_id:
        return "another host (boot ids differ)"
    if local.gpu_uuid != peer.gpu_uuid:
        return f"another GPU ({peer.gpu_uuid} there, {local.gpu_uuid} here)"
    for name in ("ipc_namespace", "pid_namespace"):
        mine, theirs = getattr(local, name), getattr(peer, name)
        if mine and theirs and mine != theirs:
            return f"another {name.replace('_', ' ')} ({theirs} there, {mine} here)"
    if local.pid == peer.pid and local.pid_namespace == peer.pid_namespace:
        return "same process"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
