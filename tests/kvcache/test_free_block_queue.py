from __future__ import annotations

import pytest

from kvcache.block import KVBlock
from kvcache.errors import BlockStateError
from kvcache.free_queue import FreeBlockQueue


def ids(queue: FreeBlockQueue) -> list[int]:
    return [block.block_id for block in queue.blocks()]


def make(n: int) -> tuple[list[KVBlock], FreeBlockQueue]:
    blocks = [KVBlock(block_id=i) for i in range(n)]
    return blocks, FreeBlockQueue(blocks)


def test_initial_order_is_block_id_order() -> None:
    blocks, queue = make(5)
    assert ids(queue) == [0, 1, 2, 3, 4]
    assert len(queue) == 5
    assert all(block.in_free_queue for block in blocks)


def test_popleft_takes_head_and_unlinks() -> None:
    _, queue = make(3)
    first = queue.popleft()
    assert first.block_id == 0
    assert not first.in_free_queue and first.next_free is None
    assert ids(queue) == [1, 2]
    assert len(queue) == 2


def test_append_goes_to_tail() -> None:
    blocks, queue = make(3)
    queue.popleft()
    queue.append(blocks[0])
    assert ids(queue) == [1, 2, 0]


@pytest.mark.parametrize(("victim", "rest"), [(0, [1, 2, 3]), (2, [0, 1, 3]), (3, [0, 1, 2])])
def test_remove_head_middle_tail(victim: int, rest: list[int]) -> None:
    blocks, queue = make(4)
    queue.remove(blocks[victim])
    assert ids(queue) == rest
    assert len(queue) == 3
    assert not blocks[victim].in_free_queue


def test_remove_only_block_leaves_empty_queue() -> None:
    blocks, queue = make(1)
    queue.remove(blocks[0])
    assert len(queue) == 0
    assert ids(queue) == []
    queue.append(blocks[0])
    assert ids(queue) == [0]


def test_empty_queue() -> None:
    _, queue = make(0)
    assert len(queue) == 0
    assert queue.blocks() == []
    with pytest.raises(BlockStateError):
        queue.popleft()


def test_popleft_until_empty_then_refill() -> None:
    blocks, queue = make(3)
    popped = [queue.popleft().block_id for _ in range(3)]
    assert popped == [0, 1, 2]
    with pytest.raises(BlockStateError):
        queue.popleft()
    for block in reversed(blocks):
        queue.append(block)
    assert ids(queue) == [2, 1, 0]


def test_misuse_raises() -> None:
    blocks, queue = make(2)
    with pytest.raises(BlockStateError):
        queue.append(blocks[0])  # already queued
    queue.remove(blocks[1])
    with pytest.raises(BlockStateError):
        queue.remove(blocks[1])  # not queued
    assert ids(queue) == [0]
