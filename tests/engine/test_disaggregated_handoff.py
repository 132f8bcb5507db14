"""Prefill on one engine, KV bytes into another's reserved blocks, decode there: same tokens as mixed.

This is the engine-level mechanism behind the prefill and decode services (no gRPC here).
"""

from __future__ import annotations

import pytest

from kvcache.kv_bytes import read_blocks, write_blocks
from services.engine.errors import InvalidRequestError
from services.engine.request import RequestStatus
from services.engine.reservations import LeaseExpiredError, Refusal
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.engine.prompts import long_text

pytestmark = pytest.mark.slow


def _prefill(engine, request_id, prompt_ids, sampling):
    request = engine.add_request(sampling=sampling, token_ids=prompt_ids, request_id=request_id, prefill_only=True)
    while engine.has_unfinished():
        engine.step()
    assert request.status is RequestStatus.FINISHED_HANDED_OFF and request_id in engine.held
    return request


def _hand_off(prefill, decode, request, sampling, lease_s=30.0):
    grant = decode.reserve(request.request_id, request.prompt_token_ids, sampling, lease_s)
    assert not isinstance(grant, Refusal), grant
    source = prefill.transferable_block_ids(request)
    assert len(source) == len(grant.block_ids)
    todo = list(range(grant.num_cached_blocks, len(source)))
    decode.reservations.receive(request.request_id, [grant.block_ids[i] for i in todo])
    payload = read_blocks(prefill.runner.kv_cache, [source[i] for i in todo])
    write_blocks(decode.runner.kv_cache, [grant.block_ids[i] for i in todo], payload)
    prefill.release(request.request_id)
    return decode.commit(request.request_id, request.output_token_ids[0]), grant


def _run_disaggregated(prefill, decode, prompts, sampling):
    """Each of ``prompts`` (request id → token ids) prefilled on ``prefill``, handed off to ``decode`` and
    decoded to the end there; the decode node's requests by id."""
    handed = {}
    for rid, ids in prompts.items():
        first = _prefill(prefill, rid, ids, sampling)
        handed[rid], _ = _hand_off(prefill, decode, first, sampling)
    while decode.has_unfinished():
        decode.step()
    return handed


def test_handoff_matches_mixed_and_frees_everything(fp32_model, bundled_tokenizer):
    sampling = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = {"a": bundled_tokenizer.encode(long_text(3)), "b": bundled_tokenizer.encode("Hello there, how")}
    mixed = make_engine(fp32_model, bundled_tokenizer)
    expected = {rid: r.token_ids for rid, r in zip(prompts, mixed.generate(list(prompts.values()), sampling),
                                                    strict=True)}
    prefill = make_engine(fp32_model, bundled_tokenizer, max_num_batched_tokens=64)
    decode = make_engine(fp32_model, bundled_tokenizer)
    handed = _run_disaggregated(prefill, decode, prompts, sampling)
    assert {rid: r.output_token_ids for rid, r in handed.items()} == expected
    for engine in (prefill, decode):
        engine.check_integrity()
        assert engine.kv.num_free_blocks == engine.kv.num_blocks and not engine.held


def test_a_prefill_pool_smaller_than_the_generation_still_hands_it_off(fp32_model, bundled_tokenizer):
    """A prefill node holds the prompt and the first token only: its pool bounds those, never max_tokens
    (it refused a 10-token prompt with max_tokens 55 because its 64-token pool could not hold 65)."""
    sampling = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    ids = bundled_tokenizer.encode("Hello there, how are you doing today?")
    expected = make_engine(fp32_model, bundled_tokenizer).generate([ids], sampling)[0].token_ids
    prefill = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=4)  # 64 tokens
    decode = make_engine(fp32_model, bundled_tokenizer)
    with pytest.raises(InvalidRequestError, match="exceed the KV pool of 64 tokens"):  # what it must not do
        prefill.add_request(sampling=sampling, token_ids=ids)  # ... unless it generates the whole request
    handed, _ = _hand_off(prefill, decode, _prefill(prefill, "a", ids, sampling), sampling)
    while decode.has_unfinished():
        decode.step()
    assert handed.output_token_ids == expected
    with pytest.raises(InvalidRequestError, match="64 prompt tokens and the first new one exceed the KV pool") as info:
        prefill.add_request(sampling=sampling, token_ids=[7] * 64, prefill_only=True)
    assert info.value.field == "prompt"
    prefill.check_integrity()


def test_second_handoff_of_a_prefix_skips_blocks_the_decode_node_holds(fp32_model, bundled_tokenizer):
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = bundled_tokenizer.encode(long_text(2))
    prefill, decode = make_engine(fp32_model, bundled_tokenizer), make_engine(fp32_model, bundled_tokenizer)
    first, _ = _hand_off(prefill, decode, _prefill(prefill, "one", prompt, sampling), sampling)
    while decode.has_unfinished():
        decode.step()
    again, grant = _hand_off(prefill, decode, _prefill(prefill, "two", prompt, sampling), sampling)
    assert grant.num_cached_blocks == (len(prompt) - 1) // decode.kv.block_size
    while decode.has_unfinished():
        decode.step()
    assert again.output_token_ids == first.output_token_ids


def test_reservation_refused_when_running_requests_need_the_room(fp32_model, bundled_tokenizer):
    decode = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16)
    running = decode.add_request(sampling=SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True),
                                 token_ids=list(range(100, 200)))
    decode.step()  # prefilled: holds 7 blocks and expects ~0.7 × 150 more tokens (6 more blocks)
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    refusal = decode.reserve("new", list(range(300, 350)), sampling, 10.0)
    assert isinstance(refusal, Refusal) and "no room" in refusal.reason, refusal
    assert not decode.reservations.reservations and not decode.kv.has_request("new")
    decode.abort(running.request_id)
    assert not isinstance(decode.reserve("new", list(range(300, 350)), sampling, 10.0), Refusal)
    decode.abort("new")
    assert decode.kv.num_free_blocks == 16
    decode.check_integrity()


def test_lease_expiry_and_bad_block_ids_free_the_grant(fp32_model, bundled_tokenizer):
    decode = make_engine(fp32_model, bundled_tokenizer)
    sampling = SamplingParams(max_tokens=4)
    grant = decode.reserve("r", list(range(100, 140)), sampling, lease_s=0.0)
    with pytest.raises(InvalidRequestError, match="block_ids"):
        decode.reservations.receive("r", [max(grant.block_ids) + 1])
    assert decode.reservations.expire() == ["r"]
    with pytest.raises(LeaseExpiredError):
        decode.commit("r", 5)
    assert decode.kv.num_free_blocks == decode.kv.num_blocks
    decode.check_integrity()


def test_granted_but_uncommitted_requests_keep_their_headroom(fp32_model, bundled_tokenizer):
    """A reservation will decode here soon: the next grant must leave room for its output too."""
    decode = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16)
    first = decode.reserve("first", list(range(100, 200)), SamplingParams(max_tokens=150), 10.0)
    assert not isinstance(first, Refusal)  # 7 blocks now, ~6 more expected for its output
    second = decode.reserve("second", list(range(300, 350)), SamplingParams(max_tokens=4), 10.0)
    assert isinstance(second, Refusal), second
    decode.abort("first")
    assert decode.kv.num_free_blocks == 16
    decode.check_integrity()
