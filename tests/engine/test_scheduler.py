"""Scheduler policy without a model: budget, chunking, admission, prefix hits, decode-only preemption."""

from __future__ import annotations

import math

from kvcache.hashing import model_fingerprint
from kvcache.manager import KVCacheManager
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.step_batch import SchedulerConfig

BLOCK = 4


def _scheduler(num_blocks: int = 32, budget: int = 16, max_seqs: int = 8) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK, model_fingerprint(model="scheduler-test"))
    return Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=256), kv)


def _request(rid: str, prompt: list[int], max_tokens: int = 8) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


def _run_step(scheduler: Scheduler, token: int = 7):
    batch = scheduler.schedule()
    sampled = {s.request.request_id: token for s in batch.scheduled if s.samples}
    scheduler.update(batch, sampled)
    return batch


def test_prefill_is_chunked_by_the_token_budget():
    s = _scheduler(budget=8)
    r = _request("a", list(range(20)))
    s.add(r)
    chunks = [[x.num_new_tokens for x in _run_step(s).scheduled] for _ in range(3)]
    assert chunks == [[8], [8], [4]]
    assert r.status is RequestStatus.RUNNING_DECODE and r.output_token_ids == [7]
    assert [x.num_new_tokens for x in _run_step(s).scheduled] == [1]


def test_decodes_run_first_then_waiting_requests_share_the_budget():
    s = _scheduler(budget=10)
    s.add(_request("a", list(range(6))))
    _run_step(s)
    s.add(_request("b", list(range(100, 120))))
    batch = _run_step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in batch.scheduled] == [("a", 1), ("b", 9)]


def test_prefix_hit_is_counted_once_and_skips_computed_blocks():
    s = _scheduler()
    prompt = list(range(13))
    s.add(_request("a", prompt, max_tokens=1))
    while s.has_unfinished():
        _run_step(s)
    b = _request("b", [*prompt, 99], max_tokens=1)
    s.add(b)
    batch = _run_step(s)
    assert batch.scheduled[0].start == 12 and batch.scheduled[0].num_new_tokens == 2
    assert b.num_cached_tokens == 12
    assert (s.stats.prefix_hit_tokens_total, s.stats.prompt_tokens_total) == (12, 13 + 14)
    assert s.stats.prefix_hit_requests_total == 1


def test_admission_waits_until_the_whole_prompt_fits():
    s = _scheduler(num_blocks=6, budget=64)
    s.add(_request("a", list(range(16)), max_tokens=4))  # 5 blocks incl. its first decode token
    s.add(_request("b", list(range(50, 62)), max_tokens=4))  # 4 blocks: must wait
    batch = _run_step(s)
    assert [x.request.request_id for x in batch.scheduled] == ["a"]
    assert [r.request_id for r in s.waiting] == ["b"]


def test_newest_decoding_request_is_preempted_never_a_prefill():
    s = _scheduler(num_blocks=8, budget=64)
    s.add(_request("old", list(range(7)), max_tokens=20))
    s.add(_request("new", list(range(50, 57)), max_tokens=20))
    _run_step(s)  # both prefilled: 2 blocks each
    s.kv.check_integrity()
    preempted = []
    for _ in range(12):
        batch = _run_step(s)
        preempted += [r.request_id for r in batch.preempted]
        s.kv.check_integrity()
    assert preempted and set(preempted) == {"new"}


def test_prefill_takes_blocks_from_a_decode_not_the_other_way_round():
    s = _scheduler(num_blocks=8, budget=4)
    s.add(_request("dec", list(range(3)), max_tokens=30))
    _run_step(s)
    for _ in range(10):  # grow the decode to 4 blocks
        _run_step(s)
    pre = _request("pre", list(range(100, 114)), max_tokens=2)  # 4 blocks + 1 for its decode
    s.add(pre)
    statuses = []
    for _ in range(8):
        batch = _run_step(s)
        statuses += [(r.request_id, "preempted") for r in batch.preempted]
        s.kv.check_integrity()
    assert ("pre", "preempted") not in statuses
    assert pre.num_output_tokens >= 1


def test_finish_and_abort_return_every_block():
    s = _scheduler()
    a, b = _request("a", list(range(9)), max_tokens=3), _request("b", list(range(30, 41)), max_tokens=50)
    s.add(a)
    s.add(b)
    for _ in range(3):
        _run_step(s)
    assert a.status is RequestStatus.FINISHED_LENGTH and a.num_output_tokens == 3
    s.finish(b, RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished()
    assert s.kv.num_free_blocks == s.kv.num_blocks
    s.kv.check_integrity()


def test_stop_token_and_eos():
    s = _scheduler()
    eos = Request("e", [1, 2, 3], SamplingParams(max_tokens=9), eos_token_ids=(7,))
    stop = Request("s", [4, 5, 6], SamplingParams(max_tokens=9, ignore_eos=True, stop_token_ids=(7,)))
    ignore = Request("i", [8, 9, 10], SamplingParams(max_tokens=2, ignore_eos=True), eos_token_ids=(7,))
    for r in (eos, stop, ignore):
        s.add(r)
    _run_step(s, token=7)
    assert eos.finish_reason == "stop" and eos.stop_reason == 7
    assert stop.finish_reason == "stop"
    assert ignore.status is RequestStatus.RUNNING_DECODE


class RemoteOffloader:
    """Keeps every victim's copy "in the cache-store": ready only after a prefetch brought it back."""

    def __init__(self) -> None:
        self.copies: set[str] = set()
        self.fetched: set[str] = set()
        self.prefetched: list[str] = []

    def claim(self, request_id: str, num_blocks: int) -> bool:
        self.copies.add(request_id)
        return True

    def ready(self, request_id: str) -> bool | None:
        return (request_id in self.fetched) if request_id in self.copies else None

    def prefetch(self, request_id: str) -> None:
        self.prefetched.append(request_id)
        self.fetched.add(request_id)

    def discard(self, request_id: str) -> None:
        self.copies.discard(request_id)
        self.fetched.discard(request_id)


def test_a_stored_copy_is_fetched_back_only_when_its_request_could_resume():
    """Fetched while the pool had no room, a copy would sit in host memory (counted against the staging
    limit, so the next victim is recomputed) until room came."""
    offloader = RemoteOffloader()
    kv = KVCacheManager(8, BLOCK, model_fingerprint(model="scheduler-test"))
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256), kv,
                  offloader=offloader)
    s.add(_request("old", list(range(7)), max_tokens=12))
    s.add(_request("new", list(range(50, 57)), max_tokens=12))
    preempted_at = None
    for step in range(40):
        batch = _run_step(s)
        s.release_swapped(batch)
        if batch.preempted and preempted_at is None:
            preempted_at = step
        if "old" in {r.request_id for r in s.running} and preempted_at is not None:
            assert offloader.prefetched == []  # "old" holds the blocks "new" needs: no room to resume
        if not s.running and not s.waiting:
            break
    assert preempted_at is not None and offloader.prefetched == ["new"]  # once "old" finished
    assert s.stats.resumes_total == 1 and s.stats.recomputes_total == 0
    kv.check_integrity()


class SlowStoreOffloader(RemoteOffloader):
    """A cache-store whose fetches arrive only when the test says so (a slow or hung store)."""

    def prefetch(self, request_id: str) -> None:
        self.prefetched.append(request_id)

    def arrive(self, request_id: str) -> None:
        self.fetched.add(request_id)


def _preempted_with_a_copy_in_flight(num_blocks: int) -> tuple[Scheduler, SlowStoreOffloader, Request]:
    """``victim`` preempted with its copy in the cache-store, the request that pushed it out finished, and
    its fetch started but not arrived."""
    offloader = SlowStoreOffloader()
    kv = KVCacheManager(num_blocks, BLOCK, model_fingerprint(model="scheduler-test"))
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256), kv,
                  offloader=offloader)
    s.add(_request("first", list(range(7)), max_tokens=12))
    victim = _request("victim", list(range(50, 57)), max_tokens=12)
    s.add(victim)
    for _ in range(40):
        s.release_swapped(_run_step(s))
        if not s.running:
            break
    assert victim.status is RequestStatus.PREEMPTED and list(s.waiting) == [victim]
    assert _run_step(s).scheduled == []  # the pool has room for it now: its fetch starts
    assert offloader.prefetched == ["victim"] and s.stats.resumes_total == 0
    return s, offloader, victim


def test_a_copy_on_its_way_back_holds_up_only_its_own_request():
    """A hung cache-store fetch used to stop every admission behind it until it failed (up to 30 s)."""
    s, offloader, victim = _preempted_with_a_copy_in_flight(num_blocks=8)
    small = _request("small", list(range(100, 103)), max_tokens=2)
    s.add(small)
    batch = _run_step(s)
    assert [x.request.request_id for x in batch.scheduled] == ["small"]
    assert list(s.waiting) == [victim]
    offloader.arrive("victim")
    batch = _run_step(s)
    assert "victim" in [x.request.request_id for x in batch.scheduled] and s.stats.resumes_total == 1
    assert s.stats.recomputes_total == 0


def test_the_room_of_a_copy_on_its_way_back_is_kept_for_it():
    s, offloader, victim = _preempted_with_a_copy_in_flight(num_blocks=8)
    victim_room = math.ceil((victim.num_tokens + 1) / BLOCK)
    fits_alone = (s.kv.num_free_blocks - victim_room + 1) * BLOCK - 1  # one block more than what is left
    large = _request("large", list(range(200, 200 + fits_alone - 1)), max_tokens=2)
    s.add(large)
    for _ in range(3):
        assert _run_step(s).scheduled == []  # it would fit alone, not beside the victim
    offloader.arrive("victim")
    assert [x.request.request_id for x in _run_step(s).scheduled] == ["victim"]
    s.kv.check_integrity()
