"""Migration of running requests between two decode engines (a draining node's), no gRPC here.

Engine A decodes two requests with room to spare, and keeps preempted KV in host memory first (the
default ``offload_remote``). Marked for migration, each decoding request is taken out of A's batch with its
KV copied to a (fake, in-memory) cache-store anyway, lent once stored, adopted by engine B, and let go by
A: the outputs equal an uninterrupted run. A refused loan, or a migration ended before the copy was
stored, resumes the request on A with the same output; an abort while migrating leaks nothing. A node
without a cache-store migrates by recompute: the adopter computes the KV again.
"""

from __future__ import annotations

import time

import pytest

from services.engine.admission import AdmissionConfig
from services.engine.request import RequestStatus
from services.engine.reservations import Refusal
from services.engine.sampling_params import SamplingParams
from services.engine_node.remote_store import BreakerRemoteStore
from tests.conftest import make_engine
from tests.engine.prompts import STORY
from tests.engine.test_handover_adoption import FakeStore

pytestmark = pytest.mark.slow

NEW_TOKENS = 30
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(bundled_tokenizer):
    words = STORY.split()
    return [bundled_tokenizer.encode(f"Job {i}: " + " ".join(words[i * 9:i * 9 + 20])) for i in range(2)]


@pytest.fixture(scope="module")
def expected(fp32_model, bundled_tokenizer, prompts):
    return [r.token_ids for r in make_engine(fp32_model, bundled_tokenizer).generate(prompts, GREEDY)]


def _engine(model, tokenizer, store=None):
    remote = {} if store is None else {
        "offload_cache_store": "127.0.0.1:1", "remote_store": lambda address, layout: BreakerRemoteStore(store)}
    return make_engine(model, tokenizer, num_kv_blocks=32, admission=AdmissionConfig(policy="none"), **remote)


def _decoding(engine, prompts, steps=5):
    requests = [engine.add_request(sampling=GREEDY, token_ids=p, request_id=f"m{i}") for i, p in enumerate(prompts)]
    for _ in range(steps):
        engine.step()
    assert all(r.status is RequestStatus.RUNNING_DECODE for r in requests)
    return requests


def _lent(engine, count):
    """Poll until ``count`` migrating requests are lent (their puts run on the offload's thread)."""
    ready = []
    for _ in range(400):
        ready += engine.migrations_ready().ready
        if len(ready) == count:
            return ready
        time.sleep(0.005)
    raise AssertionError(f"only {len(ready)} of {count} copies were stored")


def _run(engine):
    while engine.has_unfinished():
        engine.step()


def _assert_whole(*engines):
    for engine in engines:
        engine.check_integrity()
        assert engine.kv.num_free_blocks == engine.kv.num_blocks, "blocks leaked"
        assert not engine.handovers.lent and not engine.handovers.migrating and not engine.handovers.marked
        engine.offload.wait_io()
        assert not engine.offload._copies and engine.offload.host_bytes_used == 0, "offloaded KV leaked"


def test_marked_requests_move_mid_decode_and_finish_there_exactly_as_an_uninterrupted_run(
        fp32_model, bundled_tokenizer, prompts, expected):
    store = FakeStore()
    a, b = _engine(fp32_model, bundled_tokenizer, store), _engine(fp32_model, bundled_tokenizer)
    requests = _decoding(a, prompts)
    assert a.mark_for_migration(["m0", "m1", "not-here"]) == ["m0", "m1"]
    assert sorted(a.evict_for_migration()) == ["m0", "m1"]
    assert not a.scheduler.running and not a.scheduler.waiting, "held out of the queue while stored"
    assert a.kv.num_free_blocks == a.kv.num_blocks, "their blocks are free at once"
    adopted = {}
    for handed in _lent(a, 2):
        assert len(handed.output_token_ids) == 5 and handed.num_computed_tokens == len(handed.prompt_token_ids) + 4
        grant = b.adopt(handed, 30.0)
        assert not isinstance(grant, Refusal), grant
        adopted[handed.request_id] = b.complete_adoption(handed.request_id,
                                                         b"".join(store.get(grant.keys, restore=True)))
        assert a.settle_handover(handed.request_id, granted=True)
    assert all(r.status is RequestStatus.FINISHED_ABORTED for r in requests) and not a.has_unfinished()
    _run(b)
    assert [adopted["m0"].output_token_ids, adopted["m1"].output_token_ids] == expected
    assert a.handovers.stats.handovers_out_total == 2 and b.adoptions.stats.handovers_in_total == 2
    assert a.scheduler.stats.preemptions_total == 0, "a migration is not a preemption"
    assert b.scheduler.stats.recomputes_total == 0
    _assert_whole(a, b)
    assert not store.blocks, "the copies are deleted once the adopter read them"


def test_a_refused_or_unstored_migration_resumes_here_with_the_same_output(fp32_model, bundled_tokenizer, prompts,
                                                                          expected):
    store = FakeStore()
    a = _engine(fp32_model, bundled_tokenizer, store)
    requests = _decoding(a, prompts)
    a.mark_for_migration(["m0"])
    assert a.evict_for_migration() == ["m0"]
    (handed,) = _lent(a, 1)
    assert a.settle_handover(handed.request_id, granted=False)  # no peer took it
    a.mark_for_migration(["m1"])
    assert a.evict_for_migration() == ["m1"]
    assert a.end_migrations() == ["m1"], "ended before (or after) its copy was stored: back in the queue"
    assert {r.request_id for r in a.scheduler.waiting} == {"m0", "m1"}
    _run(a)
    assert [r.output_token_ids for r in requests] == expected
    assert a.scheduler.stats.recomputes_total == 0 and a.handovers.stats.handovers_out_total == 0
    _assert_whole(a)
    assert not store.blocks


def test_aborts_while_migrating_leak_nothing(fp32_model, bundled_tokenizer, prompts):
    store = FakeStore()
    a = _engine(fp32_model, bundled_tokenizer, store)
    _decoding(a, prompts)
    a.mark_for_migration(["m0", "m1"])
    a.evict_for_migration()
    a.abort("m0")  # while its copy is on its way
    (handed,) = _lent(a, 1)
    a.abort("m1")  # while lent
    assert not a.settle_handover(handed.request_id, granted=True), "gone: the adopter must drop it"
    assert a.migrations_ready().pending == 0 and not a.has_unfinished()
    _assert_whole(a)
    assert not store.blocks



def test_a_node_without_a_cache_store_migrates_by_recompute(fp32_model, bundled_tokenizer, prompts, expected):
    """No copy to hand: each marked request leaves the batch with its blocks freed and is lent at once as
    tokens only. The adopter recomputes its KV and decodes on; one no peer took is recomputed here."""
    a, b = _engine(fp32_model, bundled_tokenizer), _engine(fp32_model, bundled_tokenizer)
    requests = _decoding(a, prompts)
    assert a.mark_for_migration(["m0", "m1"]) == ["m0", "m1"]
    assert sorted(a.evict_for_migration()) == ["m0", "m1"]
    assert a.kv.num_free_blocks == a.kv.num_blocks, "their blocks are free at once"
    poll = a.migrations_ready()
    assert sorted(h.request_id for h in poll.ready) == ["m0", "m1"] and poll.pending == 0
    handed = {h.request_id: h for h in poll.ready}
    assert all(h.recompute and len(h.output_token_ids) == 5 for h in handed.values())
    grant = b.adopt(handed["m0"], 30.0)
    assert not isinstance(grant, Refusal) and grant.keys == () and grant.block_ids == ()
    adopted = b.complete_adoption("m0", b"")
    assert a.settle_handover("m0", granted=True)
    assert a.settle_handover("m1", granted=False), "no peer took it: back in A's queue"
    _run(a)
    _run(b)
    assert [adopted.output_token_ids, requests[1].output_token_ids] == expected
    assert b.scheduler.stats.recomputes_total == 1 and a.scheduler.stats.recomputes_total == 1
    assert b.adoptions.stats.handovers_in_total == 1 and a.handovers.stats.handovers_out_total == 1
    _assert_whole(a, b)


def test_a_recompute_adoption_is_refused_without_room_and_an_abort_before_completion_frees_it(
        fp32_model, bundled_tokenizer, prompts):
    a = _engine(fp32_model, bundled_tokenizer)
    _decoding(a, prompts)
    a.mark_for_migration(["m0", "m1"])
    a.evict_for_migration()
    handed = {h.request_id: h for h in a.migrations_ready().ready}
    small = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=4, admission=AdmissionConfig(policy="none"))
    small.add_request(sampling=GREEDY, token_ids=prompts[0], request_id="busy")
    small.step()  # its prompt holds most of the blocks
    refusal = small.adopt(handed["m1"], 30.0)  # another prompt: no prefix hit there
    assert isinstance(refusal, Refusal), "no room for the recompute: refused, nothing held"
    small.abort("busy")
    b = _engine(fp32_model, bundled_tokenizer)
    assert not isinstance(b.adopt(handed["m0"], 30.0), Refusal)
    assert b.abort("m0"), "a granted adoption not yet completed is aborted like a reservation"
    for rid in ("m0", "m1"):
        a.abort(rid)
        assert not a.settle_handover(rid, granted=False)
    _assert_whole(a, b, small)
