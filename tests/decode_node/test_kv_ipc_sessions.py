"""The decode node's CUDA IPC sessions: which offers it takes (identity, layout, mapping, probe) and the
block copies out of a mapped pool (CUDA IPC stood in for by tests/ipc_fakes.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pdserve.v1 import node_pb2

from kvcache.cuda_ipc import IpcError, probe_digest, probe_pattern
from services.decode_node.kv_ipc import IpcSessions
from tests.ipc_fakes import DECODE_ID, FakeIpc

LAYOUT = node_pb2.KVLayout(dtype="bfloat16", block_size=4, num_layers=3, num_kv_heads=2, head_dim=8,
                           model_fingerprint=b"model", bytes_per_block=3 * 2 * 4 * 2 * 8 * 2)


def pool(num_blocks: int, seed: int) -> torch.Tensor:
    return torch.randn(3, num_blocks, 2, 4, 2, 8, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.fixture
def ipc() -> FakeIpc:
    return FakeIpc()


def sessions(ipc: FakeIpc, identity=DECODE_ID, reader=None) -> IpcSessions:
    kwargs = {"reader": reader} if reader is not None else {}
    return IpcSessions(pool(8, seed=0), LAYOUT, identity, opener=ipc.open, **kwargs)


def test_an_offer_from_the_same_host_and_gpu_is_probed_and_taken(ipc: FakeIpc) -> None:
    here = sessions(ipc)
    source = pool(20, seed=1)
    export = ipc.pool_export(source, LAYOUT)
    answer = here.open(export.offer)
    assert answer.accepted and answer.reason == ""
    assert answer.probe_digest == probe_digest(probe_pattern(export.offer.probe_nonce))
    here.copy("session-1", [19, 0, 7], [3, 6, 0])
    for s, d in ((19, 3), (0, 6), (7, 0)):
        assert torch.equal(here.pool[:, d], source[:, s])


@pytest.mark.parametrize(("change", "reason"), [
    ({"boot_id": "other"}, "another host"),
    ({"gpu_uuid": "GPU-other"}, "another GPU"),
    ({"pid": DECODE_ID.pid}, "same process"),
])
def test_offers_from_elsewhere_are_refused(ipc: FakeIpc, change: dict, reason: str) -> None:
    export = ipc.pool_export(pool(20, 1), LAYOUT, identity=dataclasses.replace(DECODE_ID, **{"pid": 1, **change}))
    answer = sessions(ipc).open(export.offer)
    assert not answer.accepted and reason in answer.reason
    assert ipc.opened == 0  # nothing mapped


def test_refusals_for_layout_mapping_and_probe(ipc: FakeIpc) -> None:
    here = sessions(ipc)
    other_model = dataclasses.replace(ipc.pool_export(pool(20, 1), LAYOUT).offer,
                                      layout=node_pb2.KVLayout(**{**_fields(LAYOUT), "model_fingerprint": b"x"}))
    assert "layout.model_fingerprint differs" in here.open(other_model).reason
    stale = ipc.pool_export(pool(20, 1), LAYOUT)
    ipc.tensors.clear()
    assert "invalid handle" in here.open(stale.offer).reason
    wrong_shape = ipc.pool_export(torch.zeros(3, 20, 2, 4, 2, 16, dtype=torch.bfloat16), LAYOUT)
    assert "pool layouts differ" in here.open(wrong_shape.offer).reason
    liar = sessions(ipc, reader=lambda probe: bytes(len(probe)))
    assert "probe read back other bytes" in liar.open(ipc.pool_export(pool(20, 1), LAYOUT).offer).reason
    assert not here.sessions and not liar.sessions


def test_a_node_without_ipc_refuses_and_says_why(ipc: FakeIpc) -> None:
    answer = sessions(ipc, identity=None).open(ipc.pool_export(pool(20, 1), LAYOUT).offer)
    assert not answer.accepted and "kv_ipc off or a CPU pool" in answer.reason


def test_a_new_offer_from_the_same_process_replaces_its_session(ipc: FakeIpc) -> None:
    here = sessions(ipc)
    assert here.open(ipc.pool_export(pool(20, 1), LAYOUT, session_id="old").offer).accepted
    assert here.open(ipc.pool_export(pool(20, 2), LAYOUT, session_id="new").offer).accepted
    assert list(here.sessions) == ["new"]
    with pytest.raises(IpcError, match="no CUDA IPC session 'old'"):
        here.copy("old", [0], [0])
    with pytest.raises(IpcError, match="outside a pool"):
        here.copy("new", [20], [0])


def _fields(layout: node_pb2.KVLayout) -> dict:
    return {f.name: getattr(layout, f.name) for f in layout.DESCRIPTOR.fields}


def test_sessions_of_prefill_processes_that_are_gone_are_unmapped(ipc: FakeIpc) -> None:
    import os
    import subprocess
    import sys

    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(exited.stdout), os.getppid()
    here = sessions(ipc)
    dead = dataclasses.replace(DECODE_ID, pid=dead_pid)
    live = dataclasses.replace(DECODE_ID, pid=live_pid)
    assert here.open(ipc.pool_export(pool(20, 1), LAYOUT, identity=dead, session_id="dead").offer).accepted
    assert here.prune() == ["dead"] and not here.sessions
    assert here.open(ipc.pool_export(pool(20, 1), LAYOUT, identity=dead, session_id="dead").offer).accepted
    assert here.open(ipc.pool_export(pool(20, 1), LAYOUT, identity=live, session_id="live").offer).accepted
    assert list(here.sessions) == ["live"]  # every new offer prunes first


def test_another_caller_can_neither_take_over_a_session_id_nor_replace_a_session_by_naming_its_process(
        ipc: FakeIpc) -> None:
    import os

    here = sessions(ipc)
    mine = pool(20, 1)
    live = dataclasses.replace(DECODE_ID, pid=os.getppid())  # a process that exists: pruning keeps its session

    def offer(source: torch.Tensor, session_id: str):
        return ipc.pool_export(source, LAYOUT, identity=live, session_id=session_id).offer

    assert here.open(offer(mine, "s1"), owner="cn:prefill-a").accepted
    opened = ipc.opened
    # the same session id from another caller: refused before anything is mapped
    hijack = here.open(offer(pool(20, 2), "s1"), owner="cn:prefill-b")
    assert not hijack.accepted and hijack.reason == "session_id is another caller's session"
    assert ipc.opened == opened and here.owner_of("s1") == "cn:prefill-a"
    # another caller claiming the same process (identity is the offer's word): its own session, a's stays
    assert here.open(offer(pool(20, 3), "s2"), owner="cn:prefill-b").accepted
    assert sorted(here.sessions) == ["s1", "s2"]
    here.copy("s1", [5], [2])
    assert torch.equal(here.pool[:, 2], mine[:, 5])
    # the owner itself may re-offer under the same id
    assert here.open(offer(pool(20, 4), "s1"), owner="cn:prefill-a").accepted
    assert sorted(here.sessions) == ["s1", "s2"] and here.owner_of("s1") == "cn:prefill-a"
