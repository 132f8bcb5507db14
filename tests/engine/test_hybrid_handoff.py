"""A hybrid model (Qwen3.5's tiny checkpoint, float32) prefilled on one engine and decoded on another: its recurrent
state travels with the first token (``FirstToken.recurrent_state``) and is written at the commit, so the tokens are
transformers'; a commit before the whole state arrived, and state pieces of another size, out of order or past the
end, are refused naming the field with nothing changed; every slot and block is free after."""

from __future__ import annotations

import pytest
import torch

from kvcache.kv_bytes import read_blocks, write_blocks
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import InvalidRequestError
from services.engine.handover import HandedRequest
from services.engine.prefill_role import FirstToken, HandoffPlan
from services.engine.reservations import IncompleteTransferError, Refusal
from services.engine.sampling_params import SamplingParams
from services.engine.step_batch import StepBatch
from tests.engine.test_model_families import assert_matches
from tests.engine.tiny_families import greedy_full_forward, load_reference

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPT = [(i * 7919) % 49000 + 17 for i in range(150)]  # 3 chunks of 64 on the prefill engine
OTHER = [(i * 104729) % 49000 + 3 for i in range(90)]


def _engine(path, **overrides) -> LLMEngine:
    settings = dict(model_path=str(path), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=64)
    return LLMEngine.from_config(EngineConfig(**(settings | overrides)))


@pytest.fixture(scope="module")
def hybrid(family_dir):
    path = family_dir("qwen3_5")
    reference = load_reference(path)
    return path, greedy_full_forward(reference, PROMPT, GREEDY.max_tokens), reference


def _prefill(engine: LLMEngine, request_id: str, prompt: list[int] = PROMPT) -> FirstToken:
    engine.admit_prefill(request_id, prompt, GREEDY, HandoffPlan())
    while True:
        for item in engine.handoff_progress(engine.step()):
            if isinstance(item, FirstToken):
                return item


def _reserve_and_send_blocks(prefill: LLMEngine, decode: LLMEngine, request_id: str, prompt: list[int] = PROMPT
                             ) -> None:
    grant = decode.reserve(request_id, prompt, GREEDY, 30.0)
    assert not isinstance(grant, Refusal), grant
    assert grant.num_cached_blocks == 0  # the decode node has not seen the prompt
    source = prefill.transferable_block_ids(prefill.held[request_id])
    decode.receive_blocks(request_id, list(grant.block_ids))
    write_blocks(decode.runner.kv_cache, grant.block_ids, read_blocks(prefill.runner.kv_cache, source))


def _decode_to_the_end(decode: LLMEngine, request_id: str, first: int) -> list[int]:
    tokens = [first]
    while decode.has_unfinished():
        tokens += [t for out in decode.step() if out.request_id == request_id for t in out.new_token_ids]
    return tokens


def _all_free(engine: LLMEngine) -> None:
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert engine.state_slots is not None and not engine.state_slots.holders()


def test_the_state_travels_with_the_first_token_and_decoding_goes_on_from_it(hybrid):
    path, expected, _ = hybrid
    prefill, decode = _engine(path), _engine(path)
    first = _prefill(prefill, "r")
    state = first.recurrent_state
    assert state is not None and len(state) == decode.recurrent_states.bytes_per_slot
    _reserve_and_send_blocks(prefill, decode, "r")
    prefill.end_prefill("r")
    with pytest.raises(IncompleteTransferError, match="recurrent state"):
        decode.commit("r", first.token_id)  # nothing of the state yet: refused, the reservation kept
    half = len(state) // 2
    decode.receive_state("r", 0, len(state), state[:half])
    for offset, total, piece, field in ((half, len(state) + 4, state[half:], "state.total_bytes"),
                                        (0, len(state), state[half:], "state.offset"),
                                        (half, len(state), state[half:] + b"xx", "state.payload")):
        with pytest.raises(InvalidRequestError, match=field):
            decode.receive_state("r", offset, total, piece)
    with pytest.raises(IncompleteTransferError):
        decode.commit("r", first.token_id)
    decode.receive_state("r", half, len(state), state[half:])
    decode.commit("r", first.token_id)
    assert_matches("qwen3_5/handoff", expected, _decode_to_the_end(decode, "r", first.token_id))
    _all_free(prefill)
    _all_free(decode)


def test_a_model_without_a_state_refuses_state_pieces(family_dir):
    engine = _engine(family_dir("qwen3"))
    assert engine.recurrent_states is None and engine.state_slots is None
    assert not isinstance(engine.reserve("r", PROMPT, GREEDY, 30.0), Refusal)
    with pytest.raises(InvalidRequestError, match="state"):
        engine.receive_state("r", 0, 8, b"12345678")


def test_an_adopted_hybrid_request_is_recomputed(hybrid):
    """Another decode node's KV copy holds no recurrent state: the adopter computes prompt and output again."""
    path, expected, _ = hybrid
    engine = _engine(path)
    handed = HandedRequest("a", tuple(PROMPT), tuple(expected.token_ids[:3]), GREEDY,
                           num_computed_tokens=len(PROMPT) + 2, kv_keys=(b"k" * 16,) * 10)
    grant = engine.adopt(handed, 30.0)
    assert not isinstance(grant, Refusal), grant
    assert not grant.block_ids and not grant.keys  # nothing to fetch
    engine.complete_adoption("a", b"")
    tokens = list(expected.token_ids[:3])
    while engine.has_unfinished():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    assert_matches("qwen3_5/adopted", expected, tokens)
    assert engine.scheduler.stats.recomputes_total == 1
    _all_free(engine)


def test_a_commit_over_max_num_seqs_parks_its_state_until_a_step_gives_it_a_slot(hybrid, monkeypatch):
    """More requests may run than max_num_seqs (committed over it, as a lent request coming back makes; a reservation
    book that always finds a slot stands in for that race here): the state a commit brings while no slot is free
    waits on the request, and the step that schedules it writes it into the slot it gives; each request decodes from
    its own state."""
    path, expected, reference = hybrid
    prefill, decode = _engine(path), _engine(path, max_num_seqs=1)
    monkeypatch.setattr(decode.reservations, "no_free_slot", lambda: None)
    prompts = {"a": PROMPT, "b": OTHER}
    firsts = {rid: _prefill(prefill, rid, prompt) for rid, prompt in prompts.items()}
    for rid, first in firsts.items():
        _reserve_and_send_blocks(prefill, decode, rid, prompts[rid])
        prefill.end_prefill(rid)
        decode.receive_state(rid, 0, len(first.recurrent_state), first.recurrent_state)
        decode.commit(rid, first.token_id)
    assert decode.recurrent_states.capacity == 1 and decode._requests["b"].pending_state is not None
    tokens = {rid: [first.token_id] for rid, first in firsts.items()}
    while decode.has_unfinished():
        for out in decode.step():
            tokens[out.request_id] += out.new_token_ids
    assert_matches("qwen3_5/over-a", expected, tokens["a"])
    assert_matches("qwen3_5/over-b", greedy_full_forward(reference, OTHER, GREEDY.max_tokens), tokens["b"])
    _all_free(decode)


def test_the_states_grow_keeping_what_they_hold(hybrid):
    path, _, _ = hybrid
    states = _engine(path, max_num_seqs=2).recurrent_states
    payload = bytes(range(256)) * (states.bytes_per_slot // 256) + bytes(states.bytes_per_slot % 256)
    states.write(1, payload)
    states.grow(5)
    assert states.capacity == 5 and states.read(1) == payload and states.read(4) == bytes(states.bytes_per_slot)


def test_the_states_come_out_of_the_cache_budget(hybrid):
    path, _, _ = hybrid
    engine = _engine(path, num_kv_blocks=None, kv_cache_gib=0.01, max_num_seqs=4)
    cfg = engine.model.config
    per_slot = cfg.linear_attention.state_bytes(4)
    assert engine.recurrent_states.bytes_per_slot == per_slot
    assert engine.runner.kv_cache.shape[0] == len(cfg.kv_layers) == 1  # the attention layer's KV alone
    assert engine.recurrent_states.checkpoints == 1  # state checkpoints: a quarter of max_num_seqs
    assert engine.kv.num_blocks == (int(0.01 * 2**30) - (4 + 1) * per_slot) // (cfg.kv_bytes_per_token(4) * 16)
    with pytest.raises(ValueError, match="max_num_seqs 20 requests and 5 state_checkpoints"):
        _engine(path, num_kv_blocks=None, kv_cache_gib=0.0001, max_num_seqs=20)


def test_a_parked_state_is_dropped_when_its_request_is_preempted_and_recomputed_from_a_checkpoint(hybrid, monkeypatch):
    """A request committed while no slot was free, then preempted before a step gave it one (the newest decoding
    request is the victim), is recomputed: from the checkpoint of its prompt where one is left, never from the state
    it had parked (the state of its whole prompt, which once written at the checkpoint's position went on silently
    wrong)."""
    path, expected, _ = hybrid
    prefill, decode = _engine(path, state_checkpoints=0), _engine(path, max_num_seqs=1, state_checkpoints=2)
    monkeypatch.setattr(decode.reservations, "no_free_slot", lambda: None)
    decode.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0.0))  # a checkpoint after 144 tokens
    first = _prefill(prefill, "r", PROMPT)
    grant = decode.reserve("r", PROMPT, GREEDY, 30.0)
    new = list(grant.block_ids)[grant.num_cached_blocks:]
    decode.receive_blocks("r", new)
    source = prefill.transferable_block_ids(prefill.held["r"])[grant.num_cached_blocks:]
    write_blocks(decode.runner.kv_cache, new, read_blocks(prefill.runner.kv_cache, source))
    decode.receive_state("r", 0, len(first.recurrent_state), first.recurrent_state)
    prefill.end_prefill("r")
    decode.add_request(token_ids=OTHER, sampling=GREEDY, request_id="local")
    decode.step()  # "local" holds the one slot
    request = decode.commit("r", first.token_id)
    assert request.pending_state is not None
    decode.scheduler._preempt(request, StepBatch())  # as _grow preempts the newest decoding request
    assert request.pending_state is None
    want = torch.frombuffer(bytearray(_prefill(prefill, "x", [*PROMPT, first.token_id]).recurrent_state),
                            dtype=torch.float32)
    tokens = [first.token_id]
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids if out.request_id == "r" else []
        if request.num_computed_tokens == len(PROMPT) + 1 and "r" in decode.state_slots:
            got = torch.frombuffer(bytearray(decode.recurrent_states.read(decode.state_slots.slot_of("r"))),
                                   dtype=torch.float32)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert decode.state_checkpoints.hits_total == 1  # resumed at 144
    assert_matches("qwen3_5/parked-preempted", expected, tokens)
    prefill.end_prefill("x")
    _all_free(decode)
