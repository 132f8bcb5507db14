"""Same host and GPU detection from /proc (a fake /proc tree here) and the GPU UUID."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from kvcache.host_identity import HostIdentity, ipc_refusal, read_host_identity

BOOT = "8c6a0a43-2e1b-4f3a-9d55-1f2e3d4c5b6a"
HERE = HostIdentity(boot_id=BOOT, ipc_namespace="ipc:[4026531839]", pid_namespace="pid:[4026531836]", pid=100,
                    gpu_uuid="GPU-1111")


def fake_proc(root: Path, boot_id: str | None, ipc: str | None, pid: str | None) -> Path:
    if boot_id is not None:
        (root / "sys" / "kernel" / "random").mkdir(parents=True)
        (root / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    (root / "self" / "ns").mkdir(parents=True)
    for name, target in (("ipc", ipc), ("pid", pid)):
        if target is not None:
            os.symlink(target, root / "self" / "ns" / name)  # dangling, as in /proc
    return root


def test_reads_boot_id_and_namespaces(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, BOOT, "ipc:[4026531839]", "pid:[4026531836]")
    identity = read_host_identity("GPU-1111", proc=proc, pid=100)
    assert identity == HERE


def test_unreadable_parts_are_empty(tmp_path: Path) -> None:
    identity = read_host_identity("", proc=fake_proc(tmp_path, None, None, None))
    assert (identity.boot_id, identity.ipc_namespace, identity.pid_namespace, identity.gpu_uuid) == ("", "", "", "")
    assert identity.pid == os.getpid()


def test_this_machine_has_a_boot_id() -> None:
    if not Path("/proc/sys/kernel/random/boot_id").exists():
        pytest.skip("no /proc here")
    assert len(read_host_identity().boot_id) == 36


def peer(**changes: object) -> HostIdentity:
    return dataclasses.replace(HERE, **{"pid": 200, **changes})


@pytest.mark.parametrize(("other", "reason"), [
    (peer(), None),
    (peer(ipc_namespace="", pid_namespace=""), None),  # a sandbox hides the namespaces: the probe decides
    (peer(boot_id="0000"), "another host"),
    (peer(boot_id=""), "boot id unknown"),
    (peer(gpu_uuid="GPU-2222"), "another GPU"),
    (peer(gpu_uuid=""), "no GPU on the peer"),
    (peer(ipc_namespace="ipc:[1]"), "another ipc namespace"),
    (peer(pid_namespace="pid:[1]"), "another pid namespace"),
    (peer(pid=100), "same process"),
])
def test_refusal(other: HostIdentity, reason: str | None) -> None:
    verdict = ipc_refusal(HERE, other)
    assert verdict is None if reason is None else reason in verdict
    assert ipc_refusal(dataclasses.replace(HERE, gpu_uuid=""), other) == "no GPU on this side"


def test_same_pid_in_other_pid_namespaces_is_another_process() -> None:
    local = dataclasses.replace(HERE, pid_namespace="")
    assert ipc_refusal(local, peer(pid=100)) is None
