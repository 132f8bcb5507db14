"""The parts of the CUDA IPC module that run anywhere: the probe pattern and block copies between pools;
exporting needs CUDA (tests/kvcache/test_cuda_ipc_gpu.py maps a pool across two processes)."""

from __future__ import annotations

import pytest
import torch

from kvcache.cuda_ipc import (
    MAX_RUN_COPIES,
    PROBE_BYTES,
    IpcError,
    block_runs,
    check_pools_match,
    copy_blocks,
    export_tensor,
    make_probe,
    probe_digest,
    probe_pattern,
    read_probe,
)


def pool(num_blocks: int, seed: int, layers: int = 3, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(layers, num_blocks, 2, 4, 2, 8, generator=gen).to(dtype)


def test_probe_pattern_is_the_nonce_s() -> None:
    a, b = probe_pattern(b"n1"), probe_pattern(b"n2")
    assert len(a) == PROBE_BYTES and a == probe_pattern(b"n1") and a != b
    probe = make_probe(b"n1", "cpu")
    assert probe.dtype == torch.uint8 and read_probe(probe) == a
    assert probe_digest(read_probe(probe)) == probe_digest(a) != probe_digest(b)


def test_copy_blocks_moves_exact_bytes_between_pools_of_other_sizes() -> None:
    src, dst = pool(20, seed=1), pool(9, seed=2)
    before = dst.clone()
    src_ids, dst_ids = [17, 3, 4, 11], [8, 0, 5, 2]
    copy_blocks(src, dst, src_ids, dst_ids)
    for s, d in zip(src_ids, dst_ids, strict=True):
        assert torch.equal(dst[:, d], src[:, s])
    untouched = [b for b in range(9) if b not in dst_ids]
    assert torch.equal(dst[:, untouched], before[:, untouched])
    copy_blocks(src, dst, [], [])


def test_block_runs_group_pairs_whose_ids_both_go_up_by_one() -> None:
    assert block_runs([], []) == []
    assert block_runs([4, 5, 6, 9, 10, 2], [0, 1, 2, 7, 9, 10]) == [(4, 0, 3), (9, 7, 1), (10, 9, 1), (2, 10, 1)]


@pytest.mark.parametrize(("src_ids", "dst_ids", "runs"), [
    (list(range(3, 40)), list(range(50, 87)), 1),  # one strided copy
    ([*range(0, 10), *range(20, 30)], [*range(60, 70), *range(0, 10)], 2),
    (list(range(0, 40, 2)), list(range(99, 79, -1)), 20),  # past MAX_RUN_COPIES: gather and scatter
])
def test_copy_blocks_by_runs_or_by_gather_moves_exact_bytes(src_ids: list[int], dst_ids: list[int], runs: int) -> None:
    assert len(block_runs(src_ids, dst_ids)) == runs and (runs > MAX_RUN_COPIES) == (runs == 20)
    src, dst = pool(40, seed=3), pool(100, seed=4)
    before = dst.clone()
    copy_blocks(src, dst, src_ids, dst_ids)
    assert torch.equal(dst[:, dst_ids], src[:, src_ids])
    untouched = [b for b in range(100) if b not in dst_ids]
    assert torch.equal(dst[:, untouched], before[:, untouched])


def test_copy_blocks_within_one_pool_goes_through_a_temporary() -> None:
    one = pool(10, seed=5)
    before = one.clone()
    copy_blocks(one, one, [0, 1, 2, 3], [1, 2, 3, 4])  # overlapping runs: a strided copy would smear block 0
    assert torch.equal(one[:, 1:5], before[:, 0:4]) and torch.equal(one[:, 0], before[:, 0])


@pytest.mark.parametrize(("src_ids", "dst_ids", "message"), [
    ([1, 2], [1], "2 source blocks for 1"),
    ([20], [0], "source block ids 20..20 outside a pool of 20"),
    ([0], [-1], "destination block ids"),
])
def test_copy_blocks_refuses_bad_ids(src_ids: list[int], dst_ids: list[int], message: str) -> None:
    with pytest.raises(IpcError, match=message):
        copy_blocks(pool(20, 1), pool(9, 2), src_ids, dst_ids)


def test_pools_must_share_a_block_layout() -> None:
    check_pools_match(pool(4, 0), pool(7, 0))
    for other in (pool(4, 0, layers=2), pool(4, 0, dtype=torch.float32), torch.zeros(3, 4, 2, 4, 2, 16)):
        with pytest.raises(IpcError, match="pool layouts differ"):
            check_pools_match(pool(4, 0), other)


def test_only_cuda_tensors_export() -> None:
    with pytest.raises(IpcError, match="only CUDA tensors"):
        export_tensor(torch.zeros(4))


def test_cpu_devices_have_no_gpu_uuid() -> None:
    from kvcache.cuda_ipc import gpu_uuid

    with pytest.raises(IpcError, match="not a CUDA device"):
        gpu_uuid("cpu")
