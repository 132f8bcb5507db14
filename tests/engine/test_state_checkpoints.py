"""A hybrid model's prefix cache, the control plane (``state_checkpoints.py`` and the scheduler's use of it; no
model, milliseconds): a hit counts only as far as a checkpoint covers it, a request notes where it saves its state,
checkpoints are evicted least recently used first and never leak."""

from __future__ import annotations

import pytest

from kvcache.hashing import model_fingerprint
from kvcache.manager import KVCacheManager, PrefixMatch
from services.engine.request import Request
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.state_checkpoints import StateCheckpoints
from services.engine.step_batch import SchedulerConfig

BLOCK = 4


def _keys(n: int) -> tuple[bytes, ...]:
    return tuple(bytes([i]) * 16 for i in range(1, n + 1))


def _match(n: int) -> PrefixMatch:
    return PrefixMatch(tuple(range(10, 10 + n)), n * BLOCK, _keys(n))


def test_a_hit_counts_as_far_as_its_deepest_checkpoint():
    checkpoints = StateCheckpoints(4)
    assert checkpoints.usable(_match(5)).num_blocks == 0
    keys = _keys(5)
    checkpoints.reserve(keys[1])
    checkpoints.reserve(keys[3])
    usable = checkpoints.usable(_match(5))
    assert usable == PrefixMatch((10, 11, 12, 13), 4 * BLOCK, keys[:4])
    assert checkpoints.usable(_match(3)) == PrefixMatch((10, 11), 2 * BLOCK, keys[:2])
    checkpoints.check_integrity()


@pytest.mark.parametrize(("prompt", "matched", "usable", "want"), [
    (21, 0, 0, (20,)),  # nothing cached: the last block boundary before the last token
    (20, 0, 0, (16,)),  # a prompt of whole blocks: its last token is computed, so the boundary before it
    (3, 0, 0, ()),  # shorter than a block: nothing to save
    (21, 3, 0, (12, 20)),  # its prompt leaves the cached blocks at 12: a checkpoint there too
    (21, 3, 3, (20,)),  # the cached blocks are covered: only the end
    (21, 5, 2, (20,)),  # where it leaves them is the end
    (21, 5, 5, ()),  # all of it is covered
])
def test_where_a_request_saves_its_state(prompt, matched, usable, want):
    assert StateCheckpoints.positions(prompt, _match(matched), _match(usable), BLOCK) == want


def test_checkpoints_are_evicted_least_recently_used_first():
    checkpoints, keys = StateCheckpoints(2), _keys(4)
    first, second = checkpoints.reserve(keys[0]), checkpoints.reserve(keys[1])
    assert {first, second} == {0, 1}
    assert checkpoints.reserve(keys[0]) is None  # saved already: refreshed, not saved again
    assert checkpoints.reserve(keys[2]) == second  # keys[1] was the least recently used
    assert keys[1] not in checkpoints and checkpoints.lookup(keys[0]) == first
    assert checkpoints.reserve(keys[3]) == second  # keys[0] was looked up since keys[2] was saved
    assert checkpoints.lookup(keys[2]) is None and len(checkpoints) == 2
    assert (checkpoints.saves_total, checkpoints.hits_total) == (4, 1)
    assert checkpoints.reserve(keys[2], busy={first, second}) is None  # this step saves into both already
    assert checkpoints.reserve(keys[2], busy={first}) == second and keys[0] in checkpoints
    checkpoints.check_integrity()
    with pytest.raises(ValueError, match="at least 0"):
        StateCheckpoints(-1)
    none = StateCheckpoints(0)  # saves nothing, so no hit is ever usable
    assert none.reserve(keys[0]) is None and none.usable(_match(3)).num_blocks == 0
    none.check_integrity()


def test_the_scheduler_admits_a_hybrid_request_with_the_covered_hit_only():
    kv = KVCacheManager(64, BLOCK, model_fingerprint(model="tiny"))
    checkpoints = StateCheckpoints(4)
    scheduler = Scheduler(SchedulerConfig(8, 64, 256), kv, checkpoints=checkpoints)
    prompt = list(range(100, 123))  # 23 tokens: 5 full blocks before the last token
    first = Request("first", prompt, SamplingParams(max_tokens=1))
    scheduler.add(first)
    scheduler.update(scheduler.schedule(), {"first": 1})
    assert first.state_saves == (20,) and first.num_cached_tokens == 0
    assert not kv.has_request("first")  # finished: its blocks stay cached
    checkpoints.reserve(kv.hash_blocks(prompt)[1])  # as if the engine had saved after 8 tokens
    again = Request("again", [*prompt[:16], 7, 7, 7, 7, 7], SamplingParams(max_tokens=1))
    scheduler.add(again)
    batch = scheduler.schedule()
    assert again.num_cached_tokens == 8 and batch.scheduled[0].start == 8  # 4 blocks cached, 2 covered
    assert again.state_saves == (16, 20)  # where it leaves the cached blocks, and its end
    assert kv.prefix_key("again", again.token_ids, 16) == kv.hash_blocks(prompt)[3]  # chained on from its hit
    assert kv.prefix_key("again", again.token_ids, 8) == kv.block_hashes("again")[1]
