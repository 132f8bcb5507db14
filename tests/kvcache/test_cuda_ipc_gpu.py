"""CUDA IPC across two real processes on one GPU: a child process plays the prefill node (allocates a KV
pool, exports it and a probe, later rewrites a block), this process the decode node (maps the pool through
``IpcSessions``, checks the probe, copies permuted blocks into its own pool). Copies must be bit-exact.
Skipped where CUDA is absent (``gpu`` marker)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from pdserve.v1 import node_pb2

pytestmark = pytest.mark.gpu

SHAPE = (4, 96, 2, 16, 3, 64)  # layers, blocks, K/V, block size, KV heads, head dim
LAYOUT = node_pb2.KVLayout(dtype="bfloat16", block_size=16, num_layers=4, num_kv_heads=3, head_dim=64,
                           model_fingerprint=b"ipc-test", bytes_per_block=4 * 2 * 16 * 3 * 64 * 2)


def _prefill_process(offers: mp.Queue, commands: mp.Queue) -> None:
    """Owns a pool of known content; exports it; on "rewrite" fills block 5 with 7s and says so."""
    from services.prefill_node.kv_ipc import export_pool

    gen = torch.Generator(device="cuda").manual_seed(1)
    pool = torch.randn(SHAPE, generator=gen, device="cuda").to(torch.bfloat16)
    export = export_pool(pool, LAYOUT)
    offers.put((export.offer, pool.cpu()))
    while (command := commands.get()) != "exit":
        assert command == "rewrite"
        pool[:, 5] = 7.0
        torch.cuda.synchronize()
        offers.put("rewritten")


@pytest.fixture(scope="module")
def prefill_process():
    context = mp.get_context("spawn")
    offers, commands = context.Queue(), context.Queue()
    process = context.Process(target=_prefill_process, args=(offers, commands), daemon=True)
    process.start()
    offer, content = offers.get(timeout=120)
    yield offer, content, offers, commands
    commands.put("exit")
    process.join(timeout=30)


def decode_sessions(num_blocks: int = 40):
    from kvcache.cuda_ipc import gpu_uuid
    from kvcache.host_identity import read_host_identity
    from services.decode_node.kv_ipc import IpcSessions

    pool = torch.zeros(SHAPE[0], num_blocks, *SHAPE[2:], dtype=torch.bfloat16, device="cuda")
    return IpcSessions(pool, LAYOUT, read_host_identity(gpu_uuid("cuda")))


def test_the_pool_maps_probes_and_copies_exactly(prefill_process) -> None:
    from kvcache.cuda_ipc import probe_digest, probe_pattern

    offer, content, _, _ = prefill_process
    sessions = decode_sessions()
    answer = sessions.open(offer)
    assert answer.accepted, answer.reason
    assert answer.probe_digest == probe_digest(probe_pattern(offer.probe_nonce))
    source = torch.randperm(SHAPE[1], generator=torch.Generator().manual_seed(2))[:30].tolist()
    destination = torch.randperm(40, generator=torch.Generator().manual_seed(3))[:30].tolist()
    sessions.copy(offer.session_id, source, destination)
    got = sessions.pool.cpu()
    for s, d in zip(source, destination, strict=True):
        assert torch.equal(got[:, d], content[:, s]), f"block {s} → {d}"
    untouched = sorted(set(range(40)) - set(destination))
    assert not got[:, untouched].any()


def test_writes_the_peer_finished_are_seen_through_the_mapping(prefill_process) -> None:
    offer, _, offers, commands = prefill_process
    sessions = decode_sessions()
    assert sessions.open(offer).accepted
    commands.put("rewrite")
    assert offers.get(timeout=60) == "rewritten"
    sessions.copy(offer.session_id, [5], [0])
    assert (sessions.pool[:, 0] == 7.0).all()


def test_an_offer_from_this_very_process_is_refused() -> None:
    from services.prefill_node.kv_ipc import export_pool

    pool = torch.zeros(SHAPE, dtype=torch.bfloat16, device="cuda")
    export = export_pool(pool, LAYOUT)
    answer = decode_sessions().open(export.offer)
    assert not answer.accepted and answer.reason == "same process"
