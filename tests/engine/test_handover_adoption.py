"""Handover of a preempted request between two decode engines, and output caching (no gRPC here).

Engine A has too few blocks for its two requests: the newest is preempted and, with ``offload_remote =
always``, its KV goes to a (fake, in-memory) cache-store. A lends it out, engine B adopts it (blocks, the
KV fetched by key, the request in its decode batch with prompt and generated tokens) and A lets it go.
Both requests' outputs equal an uninterrupted run; refusals and aborts leave both pools whole.
"""

from __future__ import annotations

import time

import pytest

from kvcache.hashing import DIGEST_SIZE
from services.cache_store.keys import store_key
from services.engine.admission import AdmissionConfig
from services.engine.errors import UnknownRequestError
from services.engine.request import RequestStatus
from services.engine.reservations import Refusal
from services.engine.sampling_params import SamplingParams
from services.engine_node.remote_store import BreakerRemoteStore
from tests.conftest import make_engine
from tests.engine.prompts import STORY

pytestmark = pytest.mark.slow

NEW_TOKENS = 40
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
# words the greedy outputs say late (after the handover; each banned after a space too, as vLLM tokenizes them):
# the adopter derives the bans from its own tokenizer
BANNED = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True,
                        bad_words=("Alex", "adventurer", "contained"))
PARAMS = {"greedy": GREEDY, "seeded": SEEDED, "banned": BANNED}


class FakeStore:
    """The cache-store as the engine's blocking client sees it: put and get by key."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}

    def put(self, blocks):
        for key, data in blocks:
            self.blocks[key] = bytes(data)

    def get(self, keys, *, restore):
        assert restore  # the engine reads back a request's own KV, never a prefix
        return [self.blocks[key] for key in keys]

    def delete(self, keys):
        return sum(self.blocks.pop(key, None) is not None for key in keys)


@pytest.fixture(scope="module")
def prompts(bundled_tokenizer):
    words = STORY.split()
    return [bundled_tokenizer.encode(f"Request {i}: " + " ".join(words[i * 7:i * 7 + 16])) for i in range(2)]


@pytest.fixture(scope="module")
def expected(fp32_model, bundled_tokenizer, prompts):
    unconstrained = make_engine(fp32_model, bundled_tokenizer)
    return {name: [r.token_ids for r in unconstrained.generate(prompts, params)] for name, params in PARAMS.items()}


def _engine_a(model, tokenizer, store, prompts):
    """Room for both prompts but not both outputs: 6 blocks of 16 tokens, admission ``none``."""
    assert all(len(p) + NEW_TOKENS > 3 * 16 for p in prompts), "each request must outgrow half the pool"
    engine = make_engine(model, tokenizer, num_kv_blocks=6, admission=AdmissionConfig(policy="none"),
                         offload_cache_store="127.0.0.1:1", offload_remote="always",
                         remote_store=lambda address, layout: BreakerRemoteStore(store))  # the fake answers
    return engine


def _engine_b(model, tokenizer, **overrides):
    return make_engine(model, tokenizer, num_kv_blocks=overrides.pop("num_kv_blocks", 16), **overrides)


def _start(engine, prompts, params):
    return [engine.add_request(sampling=params, token_ids=p, request_id=f"r{i}") for i, p in enumerate(prompts)]


def _step_until_due(engine) -> str:
    """Step until a preempted request's KV is stored in the cache-store; its id."""
    for _ in range(200):
        engine.step()
        if any(r.status is RequestStatus.PREEMPTED for r in engine.scheduler.waiting):
            for _ in range(200):  # the put runs on the offload's thread
                due = engine.handovers_due(0.0)
                if due:
                    return due[0]
                time.sleep(0.005)
    raise AssertionError("no request was preempted")


def _hand_over(a, b, store, request_id, lease_s=30.0):
    handed = a.lend(request_id)
    assert handed is not None and request_id not in {r.request_id for r in a.scheduler.waiting}
    grant = b.adopt(handed, lease_s)
    assert not isinstance(grant, Refusal), grant
    adopted = b.complete_adoption(request_id, b"".join(store.get(grant.keys, restore=True)))
    assert a.settle_handover(request_id, granted=True)
    return handed, adopted


def _run(engine):
    while engine.has_unfinished():
        engine.step()


def _assert_whole(*engines):
    for engine in engines:
        engine.check_integrity()
        assert engine.kv.num_free_blocks == engine.kv.num_blocks, "blocks leaked"
        assert not engine.reservations.reservations and not engine.handovers.lent
        assert not engine.offload._copies and engine.offload.host_bytes_used == 0, "offloaded KV leaked"


@pytest.mark.parametrize("kind", list(PARAMS))
def test_a_request_adopted_mid_decode_continues_exactly_as_an_uninterrupted_run(fp32_model, bundled_tokenizer,
                                                                                prompts, expected, kind):
    params = PARAMS[kind]
    store = FakeStore()
    a, b = _engine_a(fp32_model, bundled_tokenizer, store, prompts), _engine_b(fp32_model, bundled_tokenizer)
    requests = _start(a, prompts, params)
    moved = _step_until_due(a)
    handed, adopted = _hand_over(a, b, store, moved)
    assert 1 <= len(handed.output_token_ids) < NEW_TOKENS, "handed over mid-decode"
    assert adopted.status is RequestStatus.RUNNING_DECODE and adopted.output_token_ids == list(handed.output_token_ids)
    assert a.handovers.stats.handovers_out_total == 1 and b.adoptions.stats.handovers_in_total == 1
    assert b.adoptions.stats.fetched_bytes_total == len(handed.kv_keys) * b.offload.bytes_per_block
    _run(a)
    _run(b)
    outputs = {r.request_id: r.output_token_ids for r in requests if r.request_id != moved}
    outputs[moved] = adopted.output_token_ids
    assert [outputs["r0"], outputs["r1"]] == expected[kind]
    if params.bad_words:  # the bans first change the moved request's tokens on the adopter
        index = int(moved[1:])
        first_ban = next(i for i, (banned, free) in enumerate(zip(expected[kind][index], expected["greedy"][index],
                                                                  strict=True)) if banned != free)
        assert first_ban >= len(handed.output_token_ids), (first_ban, len(handed.output_token_ids))
        assert not any(w in b.tokenizer.decode(adopted.output_token_ids) for w in params.bad_words)
    assert adopted.finish_reason == "length" and adopted.num_output_tokens == NEW_TOKENS
    assert a.scheduler.stats.recomputes_total == b.scheduler.stats.recomputes_total == 0
    assert b.scheduler.stats.requests_admitted_total == 0, "an adopted request is counted where it was admitted"
    _assert_whole(a, b)
    a.offload.wait_io()
    assert not any(key in store.blocks for key in handed.kv_keys), "read by the adopter, then deleted"
    assert not store.blocks, "every preempted copy is deleted once read back"


def test_a_refused_adoption_leaves_both_nodes_as_they_were(fp32_model, bundled_tokenizer, prompts, expected):
    store = FakeStore()
    a = _engine_a(fp32_model, bundled_tokenizer, store, prompts)
    b = _engine_b(fp32_model, bundled_tokenizer, num_kv_blocks=8)
    hog = b.reserve("hog", list(range(100, 200)), SamplingParams(max_tokens=4), lease_s=30.0)  # 7 of 8 blocks
    assert not isinstance(hog, Refusal)
    requests = _start(a, prompts, GREEDY)
    moved = _step_until_due(a)
    victim = next(r for r in requests if r.request_id == moved)
    before = (list(victim.output_token_ids), victim.num_computed_tokens, a.offload.remote_keys(moved))
    handed = a.lend(moved)
    refusal = b.adopt(handed, 30.0)
    assert isinstance(refusal, Refusal) and "no room" in refusal.reason
    assert b.kv.num_free_blocks == 1 and set(b.reservations.reservations) == {"hog"}
    assert a.settle_handover(moved, granted=False)
    assert a.scheduler.waiting[0] is victim and victim.status is RequestStatus.PREEMPTED
    assert (list(victim.output_token_ids), victim.num_computed_tokens, a.offload.remote_keys(moved)) == before
    _run(a)
    assert [r.output_token_ids for r in requests] == expected["greedy"]
    assert a.scheduler.stats.recomputes_total == 0 and a.scheduler.stats.resumes_total >= 1
    assert a.handovers.stats.handovers_out_total == 0
    b.abort("hog")
    _assert_whole(a, b)


def test_aborts_at_every_stage_of_a_handover_leak_nothing(fp32_model, bundled_tokenizer, prompts):
    store = FakeStore()
    a, b = _engine_a(fp32_model, bundled_tokenizer, store, prompts), _engine_b(fp32_model, bundled_tokenizer)
    _start(a, prompts, GREEDY)
    moved = _step_until_due(a)

    # aborted on A while lent, and the adopter's grant not yet complete: both let it go
    handed = a.lend(moved)
    a.abort(moved)
    grant = b.adopt(handed, 30.0)
    assert not a.settle_handover(moved, granted=True), "aborted on A while offered"
    assert b.kv.num_free_blocks < b.kv.num_blocks
    b.abort(moved)  # what A's node sends to the adopter then
    a.offload.wait_io()
    assert not any(key in store.blocks for key in grant.keys), "A's abort deleted the copy (a fetch: NOT_FOUND)"
    with pytest.raises(UnknownRequestError):
        b.complete_adoption(moved, bytes(len(grant.keys) * b.offload.bytes_per_block))
    b.check_integrity()
    assert b.kv.num_free_blocks == b.kv.num_blocks

    # a grant whose lease passes before the KV arrived goes back to the pool
    other = next(r.request_id for r in a.scheduler.running)
    a.abort(other)
    c = _engine_a(fp32_model, bundled_tokenizer, store, prompts)
    _start(c, prompts, GREEDY)
    moved = _step_until_due(c)
    grant = b.adopt(c.lend(moved), lease_s=0.0)
    time.sleep(0.01)
    assert b.reservations.expire() == [moved]
    assert b.kv.num_free_blocks == b.kv.num_blocks
    assert c.settle_handover(moved, granted=False) and c.scheduler.waiting[0].request_id == moved

    # adopted, a few tokens decoded on B, then aborted there
    handed, adopted = _hand_over(c, b, store, moved)
    for _ in range(3):
        b.step()
    assert adopted.num_output_tokens == len(handed.output_token_ids) + 3
    b.abort(moved)
    _run(a)
    _run(b)
    _run(c)
    _assert_whole(a, b, c)


def test_finished_requests_full_blocks_are_written_under_content_keys(fp32_model, bundled_tokenizer, prompts):
    store = FakeStore()
    engine = make_engine(fp32_model, bundled_tokenizer, offload_cache_store="127.0.0.1:1", cache_outputs=True,
                         remote_store=lambda address, layout: BreakerRemoteStore(store))  # the fake answers
    done = engine.generate(prompts[:1], GREEDY)[0]
    all_ids = [*prompts[0], *done.token_ids]
    computed = len(all_ids) - 1  # the last token was sampled, never fed
    keys = [store_key(engine.fingerprint, h) for h in engine.kv.hash_blocks(all_ids[:computed])]
    assert len(keys) == computed // 16 > len(prompts[0]) // 16, "output blocks are cached too"
    deadline = time.monotonic() + 5
    while engine.output_cache.stats.written_blocks_total < len(keys) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.output_cache.stats.written_blocks_total == len(keys)
    assert set(store.blocks) == set(keys) and all(len(k) == 2 * DIGEST_SIZE for k in keys)
    off = make_engine(fp32_model, bundled_tokenizer, offload_cache_store="127.0.0.1:1",
                      remote_store=lambda address, layout: BreakerRemoteStore(store))
    assert off.output_cache is None
