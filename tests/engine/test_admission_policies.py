"""Admission policies and the scheduler's preemption/offload plan, without a model (milliseconds)."""

from __future__ import annotations

import math

import pytest

from kvcache.hashing import model_fingerprint
from kvcache.manager import KVCacheManager
from services.bench.sim import UnlimitedOffload, Workload, simulate
from services.engine.admission import AdmissionConfig, FixedBlocks, NewTokenRatio, StepSignal, make_policy
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.step_batch import SchedulerConfig

BLOCK = 4
QUIET = StepSignal(decoded=True, preempted=False, admitted=False, idle=False)


def _request(rid: str, prompt_len: int, max_tokens: int, generated: int = 0, base: int = 0) -> Request:
    r = Request(rid, list(range(base, base + prompt_len)), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    for _ in range(generated):
        r.append_output(1)
    return r


def _scheduler(num_blocks: int, admission: AdmissionConfig | None = None, offloader=None, budget: int = 64):
    kv = KVCacheManager(num_blocks, BLOCK, model_fingerprint(model="admission-test"))
    return Scheduler(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=1024), kv,
                     admission=make_policy(admission), offloader=offloader)


def _step(s: Scheduler):
    batch = s.schedule()
    s.release_swapped(batch)
    if isinstance(s.offloader, UnlimitedOffload):
        for swap in batch.swap_in:
            s.offloader.discard(swap.request_id)
    s.update(batch, {x.request.request_id: 7 for x in batch.scheduled if x.samples})
    return batch


# ---- the policies' arithmetic ---------------------------------------------------------------------------
def test_new_token_ratio_decays_on_quiet_decode_steps_to_its_floor_and_resets_when_idle():
    policy = NewTokenRatio(AdmissionConfig(init_ratio=0.7, min_ratio_factor=0.14, ratio_decay_steps=10))
    step = (0.7 - 0.098) / 10
    policy.on_step(QUIET, [], BLOCK)
    assert policy.ratio == pytest.approx(0.7 - step)
    policy.on_step(StepSignal(decoded=True, preempted=False, admitted=True, idle=False), [], BLOCK)
    policy.on_step(StepSignal(decoded=False, preempted=False, admitted=False, idle=False), [], BLOCK)
    assert policy.ratio == pytest.approx(0.7 - step), "admission steps and prefill-only steps do not decay"
    for _ in range(50):
        policy.on_step(QUIET, [], BLOCK)
    assert policy.ratio == pytest.approx(0.098)
    policy.on_step(StepSignal(decoded=False, preempted=False, admitted=False, idle=True), [], BLOCK)
    assert policy.ratio == 0.7


def test_new_token_ratio_is_reestimated_after_a_preemption_and_capped_at_init():
    policy = NewTokenRatio(AdmissionConfig(ratio_decay_steps=1))
    policy.on_step(QUIET, [], BLOCK)
    decoding = [_request("a", 8, 1000, generated=100), _request("b", 8, 3000, generated=20)]
    for r in decoding:
        r.status = RequestStatus.RUNNING_DECODE
    policy.on_step(StepSignal(decoded=True, preempted=True, admitted=False, idle=False), decoding, BLOCK)
    k = 16 * BLOCK
    assert policy.ratio == pytest.approx((120 + k * 2) / (4000 + 1))
    nearly_done = _request("c", 8, 50, generated=40)
    nearly_done.status = RequestStatus.RUNNING_DECODE
    policy.on_step(StepSignal(decoded=True, preempted=True, admitted=False, idle=False),
                   [nearly_done], BLOCK)  # (40 + 64) / 51 is above init: capped
    assert policy.ratio == 0.7


def test_new_token_ratio_headroom_counts_expected_tokens_beyond_held_blocks():
    policy = NewTokenRatio(AdmissionConfig(init_ratio=0.5, clip_tokens=64))
    r = _request("a", 10, max_tokens=200, generated=2)  # 12 tokens; expects min(198, 64) × 0.5 = 32 more
    assert policy.headroom_blocks([r], BLOCK, lambda _: 3) == math.ceil(44 / BLOCK) - 3
    handed = _request("p", 10, 200)
    handed.prefill_only = True
    assert policy.headroom_blocks([handed], BLOCK, lambda _: 3) == 0, "a prefill-only request decodes elsewhere"


def test_fixed_decays_to_its_floor_resets_on_preemption_and_never_exceeds_what_a_request_can_use():
    policy = FixedBlocks(AdmissionConfig(policy="fixed", fixed_blocks=8, fixed_min_blocks=2, fixed_decay_steps=6))
    long, short = _request("long", 4, 400), _request("short", 4, 5)  # short can use 2 more blocks at most
    assert policy.headroom_blocks([long, short], BLOCK, lambda _: 1) == 8 + 2
    for _ in range(100):
        policy.on_step(QUIET, [], BLOCK)
    assert policy.headroom_blocks([long], BLOCK, lambda _: 1) == 2
    policy.on_step(StepSignal(decoded=True, preempted=True, admitted=False, idle=False), [], BLOCK)
    assert policy.headroom_blocks([long], BLOCK, lambda _: 1) == 8


def test_unknown_policy_is_refused_with_its_name():
    with pytest.raises(ValueError, match="'lifo'"):
        AdmissionConfig(policy="lifo")


# ---- the scheduler with a policy ------------------------------------------------------------------------
def test_new_token_ratio_holds_back_a_prompt_that_none_admits():
    for policy, admitted in (("none", ["a", "b"]), ("new_token_ratio", ["a"])):
        s = _scheduler(num_blocks=12, admission=AdmissionConfig(policy=policy))
        s.add(_request("a", 8, max_tokens=40))  # expects 0.7 × 39 ≈ 28 more tokens: 7 more blocks
        _step(s)
        s.add(_request("b", 8, max_tokens=4, base=100))  # 3 blocks: fits only if nothing is kept back
        batch = _step(s)
        assert sorted({x.request.request_id for x in batch.scheduled}) == admitted, policy


def test_a_prefill_is_never_the_victim_even_when_it_is_the_newest_request():
    s = _scheduler(num_blocks=6, admission=AdmissionConfig(policy="none"), budget=4)
    dec = _request("dec", 7, max_tokens=30)
    s.add(dec)
    _step(s)  # dec holds 2 blocks; it needs a 3rd two steps later
    s.add(_request("pre", 12, max_tokens=2, base=100))  # owed 4 blocks (prompt + first decode): the last 4
    for _ in range(3):
        batch = _step(s)
        assert all(r.request_id != "pre" for r in batch.preempted)
    assert s.stats.preemptions_total >= 1 and dec.num_preemptions >= 1, "the decode had to give way"


# ---- preemption with the KV kept ------------------------------------------------------------------------
def test_victim_blocks_are_freed_only_after_the_step_that_copies_them_and_resume_copies_back():
    offload = UnlimitedOffload()
    s = _scheduler(num_blocks=8, admission=AdmissionConfig(policy="none"), offloader=offload)
    old, new = _request("old", 7, max_tokens=20), _request("new", 7, max_tokens=20, base=50)
    s.add(old)
    s.add(new)
    _step(s)  # both prefilled: 2 blocks each
    while not (batch := s.schedule()).swap_out:
        s.release_swapped(batch)
        s.update(batch, {x.request.request_id: 7 for x in batch.scheduled if x.samples})
    swap = batch.swap_out[0]
    assert swap.request_id == "new" and new.status is RequestStatus.PREEMPTED
    assert list(swap.block_ids) == s.kv.block_ids("new"), "blocks still held while the step copies them"
    assert "old" not in {x.request.request_id for x in batch.scheduled}, "waits a step instead of a 2nd victim"
    computed = new.num_computed_tokens
    s.release_swapped(batch)
    s.update(batch, {})
    assert not s.kv.has_request("new") and new.num_computed_tokens == computed, "KV kept: nothing to recompute"
    while new.status is RequestStatus.PREEMPTED and s.has_unfinished():
        batch = _step(s)
    resumed = [x for x in batch.swap_in if x.request_id == "new"]
    assert resumed and s.stats.resumes_total == 1 and s.stats.recomputes_total == 0
    kv_blocks = math.ceil(computed / BLOCK)
    assert resumed[0].first_index + len(resumed[0].block_ids) == kv_blocks
    while s.has_unfinished():
        _step(s)
    assert s.kv.num_free_blocks == s.kv.num_blocks and not offload.kept
    s.kv.check_integrity()


def test_aborting_a_request_whose_kv_is_kept_discards_the_copy():
    offload = UnlimitedOffload()
    s = _scheduler(num_blocks=8, admission=AdmissionConfig(policy="none"), offloader=offload)
    s.add(_request("old", 7, max_tokens=20))
    new = _request("new", 7, max_tokens=20, base=50)
    s.add(new)
    while new.status is not RequestStatus.PREEMPTED:
        _step(s)
    s.finish(new, RequestStatus.FINISHED_ABORTED)
    assert "new" not in offload.kept and not s.kv.has_request("new")


# ---- the simulator --------------------------------------------------------------------------------------
def test_simulator_runs_the_real_scheduler_without_leaks_and_the_ratio_policy_preempts_less():
    workload = Workload(requests=60, mean_input=200, mean_output=120, seed=1).generate()
    results = {p: simulate(workload, AdmissionConfig(policy=p), num_blocks=600, concurrency=32)
               for p in ("new_token_ratio", "none")}
    assert results["none"].preemptions > 0
    assert results["new_token_ratio"].preemptions < results["none"].preemptions
    kept = simulate(workload, AdmissionConfig(policy="none"), num_blocks=600, concurrency=32, offload=True)
    assert kept.preemptions > 0 and kept.recomputed_tokens == 0
