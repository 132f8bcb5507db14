"""Benchmark workloads: lengths, shared prefixes, ShareGPT parsing, seeds, and prompts that re-tokenize
to themselves (so text and token-id targets see the same prompt) with the bundled model's tokenizer."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from services.bench.datasets import DatasetSpec, WordVocabulary, build_dataset, lengths
from services.engine.model_files import bundled_model_path
from services.engine.tokenizer import Tokenizer

SHAREGPT = Path(__file__).parent / "data" / "sharegpt_tiny.json"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(bundled_model_path())


@pytest.fixture(scope="module")
def vocab(tokenizer) -> WordVocabulary:
    return WordVocabulary(tokenizer)


def test_lengths_stay_in_range_and_spread():
    values = lengths(random.Random(0), 256, 0.5, 2000)
    assert min(values) >= 128 and max(values) <= 384
    assert min(values) < 140 and max(values) > 370  # the whole range is used
    assert abs(sum(values) / len(values) - 256) < 8
    assert lengths(random.Random(0), 256, 0.0, 5) == [256] * 5
    assert lengths(random.Random(0), 1, 0.9, 50) == [1] * 50  # never below 1
    with pytest.raises(ValueError):
        lengths(random.Random(0), 10, 1.0, 1)


def test_random_prompts_have_the_asked_lengths_and_retokenize_exactly(tokenizer, vocab):
    spec = DatasetSpec(name="random", num_prompts=20, input_len=100, output_len=30, range_ratio=0.5, seed=3)
    requests = build_dataset(spec, tokenizer, vocab)
    assert len(requests) == 20
    assert all(50 <= r.prompt_len <= 150 and 15 <= r.output_len <= 45 for r in requests)
    assert len({r.prompt_len for r in requests}) > 5
    for r in requests:
        assert tuple(tokenizer.encode(r.prompt)) == r.prompt_ids


def test_datasets_are_seeded(tokenizer, vocab):
    spec = DatasetSpec(name="random", num_prompts=4, input_len=32, output_len=8, range_ratio=0.5, seed=1)
    assert build_dataset(spec, tokenizer, vocab) == build_dataset(spec, tokenizer, vocab)
    assert build_dataset(spec, tokenizer, vocab) != build_dataset(replace(spec, seed=2), tokenizer, vocab)


def test_shared_prefix_groups_share_their_system_prompt(tokenizer, vocab):
    spec = DatasetSpec(name="shared-prefix", num_prompts=12, num_groups=3, prefix_len=64, suffix_len=16,
                       output_len=8, seed=0)
    requests = build_dataset(spec, tokenizer, vocab)
    assert len(requests) == 12
    groups: dict[int, list] = {}
    for r in requests:
        groups.setdefault(r.group, []).append(r)
        assert r.prompt_len == 80 and r.output_len == 8
        assert r.prompt.startswith(r.system)
        assert tuple(tokenizer.encode(r.prompt)) == r.prompt_ids
        assert tuple(tokenizer.encode(r.system)) == r.prompt_ids[:64]
    assert sorted(groups) == [0, 1, 2] and all(len(g) == 4 for g in groups.values())
    for members in groups.values():
        assert len({m.prompt_ids[:64] for m in members}) == 1  # one prefix per group
        assert len({m.prompt_ids[64:] for m in members}) == 4  # distinct questions
    assert len({g[0].prompt_ids[:64] for g in groups.values()}) == 3  # distinct prefixes across groups
    assert [r.group for r in requests] != sorted(r.group for r in requests)  # groups interleaved
    with pytest.raises(ValueError, match="multiple"):
        build_dataset(replace(spec, num_prompts=10), tokenizer, vocab)


def test_sharegpt_takes_first_turns_and_filters_like_vllm(tokenizer):
    spec = DatasetSpec(name="sharegpt", num_prompts=3, path=SHAREGPT, seed=0)
    requests = build_dataset(spec, tokenizer)
    prompts = {r.prompt for r in requests}
    assert prompts == {  # "Hi" (prompt < 4 tokens), "Ok." (answer < 4 tokens), the unanswered one: dropped
        "What is the capital of France? Please answer in one full sentence.",
        "Write a short poem about the sea and the wind over it.",
        "List three colours of the rainbow, separated by commas.",
    }
    poem = next(r for r in requests if r.prompt.startswith("Write"))
    assert poem.output_len == len(tokenizer.encode("The sea is wide, the wind is free, they sing together endlessly."))
    assert all(tuple(tokenizer.encode(r.prompt)) == r.prompt_ids for r in requests)
    fixed = build_dataset(replace(spec, sharegpt_output_len=7), tokenizer)
    assert {r.output_len for r in fixed} == {7}
    with pytest.raises(ValueError, match="only 3 usable"):
        build_dataset(replace(spec, num_prompts=4), tokenizer)
    with pytest.raises(ValueError, match="dataset-path"):
        build_dataset(replace(spec, path=None), tokenizer)


@pytest.mark.parametrize("name", ["random", "shared-prefix"])
def test_a_salt_changes_the_words_not_the_shape(tokenizer, vocab, name):
    spec = DatasetSpec(name=name, num_prompts=8, num_groups=2, prefix_len=32, suffix_len=8, input_len=40,
                       output_len=8, range_ratio=0.5, seed=5)
    plain, salted = build_dataset(spec, tokenizer, vocab), build_dataset(replace(spec, salt=1), tokenizer, vocab)
    assert [(r.prompt_len, r.output_len, r.group) for r in plain] == [
        (r.prompt_len, r.output_len, r.group) for r in salted]
    assert all(a.prompt_ids[:8] != b.prompt_ids[:8] for a, b in zip(plain, salted, strict=True))
    assert salted == build_dataset(replace(spec, salt=1), tokenizer, vocab)
