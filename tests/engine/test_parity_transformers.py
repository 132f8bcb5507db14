"""The engine's greedy output equals transformers' on the real model, run concurrently with chunked
prefill and prefix-cache hits. A divergence is tolerated only from a step where the reference's top-2
logit margin is below 0.02 (a near tie that float rounding may flip)."""

from __future__ import annotations

import pytest

from services.engine.sampling_params import SamplingParams
from services.engine.tokenizer import ChatMessage
from tests.conftest import make_engine
from tests.engine.hf_reference import MARGIN_TOLERANCE, first_divergence, greedy_reference
from tests.engine.prompts import SYSTEM, long_text

pytestmark = pytest.mark.slow
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def prompts(bundled_tokenizer):
    tok = bundled_tokenizer
    book = long_text(13)
    chat = [ChatMessage("system", SYSTEM * 4)]
    ids = {
        "one-token": tok.encode("Hello")[:1],
        "short": tok.encode("The capital of France is"),
        "book": tok.encode(book),
        "book-question": tok.encode(book + " Question: what was the clockmaker's name? Answer:"),
        "medium": tok.encode(long_text(2)),
        "chat-trains": tok.apply_chat_template([*chat, ChatMessage("user", "When does the first train leave?")]),
        "chat-luggage": tok.apply_chat_template([*chat, ChatMessage("user", "How many bags may I bring?")]),
        "chat-haiku": tok.apply_chat_template([ChatMessage("user", "Write a haiku about autumn.")]),
        "token-soup": [(i * 7919) % 49000 + 17 for i in range(57)],
    }
    assert len(ids["one-token"]) == 1
    assert len(ids["book"]) > 800, len(ids["book"])
    return ids


@pytest.fixture(scope="module")
def references(hf_bundled_model, prompts):
    return {name: greedy_reference(hf_bundled_model, ids, NEW_TOKENS) for name, ids in prompts.items()}


def test_greedy_parity_with_transformers_concurrent_chunked_prefix(fp32_model, bundled_tokenizer, prompts,
                                                                   references):
    engine = make_engine(fp32_model, bundled_tokenizer, max_num_batched_tokens=128)
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    names = list(prompts)
    results = engine.generate([prompts[n] for n in names], sampling)

    report = []
    for name, result in zip(names, results, strict=True):
        ref = references[name]
        step = first_divergence(ref.token_ids, result.token_ids)
        if step is not None:
            margin = ref.margins[step]
            report.append(f"{name}: diverged at step {step} (reference margin {margin:.4f})")
            assert margin < MARGIN_TOLERANCE, (
                f"{name}: engine {result.token_ids} != reference {ref.token_ids} from step {step}, "
                f"where the reference margin {margin:.4f} is not a near tie"
            )
        assert len(result.token_ids) == NEW_TOKENS and result.finish_reason == "length"
    print("\n".join(report) or "all prompts identical")

    cached = {name: r.cached_tokens for name, r in zip(names, results, strict=True)}
    assert cached["book-question"] > 0 or cached["book"] > 0, cached  # the shared book prefix hit
    assert cached["chat-luggage"] > 0 or cached["chat-trains"] > 0, cached
    assert max(len(p) for p in prompts.values()) > 128  # so prefill was chunked
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_repeated_prompt_hits_prefix_cache_and_matches(fp32_model, bundled_tokenizer, prompts, references):
    engine = make_engine(fp32_model, bundled_tokenizer)
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    first = engine.generate([prompts["book"]], sampling)[0]
    second = engine.generate([prompts["book"]], sampling)[0]
    block = engine.kv.block_size
    assert first.cached_tokens == 0
    assert second.cached_tokens == (len(prompts["book"]) - 1) // block * block
    assert second.token_ids == first.token_ids
    assert first_divergence(references["book"].token_ids, second.token_ids) is None
