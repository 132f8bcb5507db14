"""Benchmark workloads: lists of prompts with the number of tokens each should generate.

Three datasets, all seeded:

- ``random`` (as ``vllm bench serve``): prompt and output lengths drawn uniformly from
  ``[len × (1 − range_ratio), len × (1 + range_ratio)]``;
- ``shared-prefix`` (as sglang's ``generated-shared-prefix``): ``num_groups`` system prompts of
  ``prefix_len`` tokens, each shared by ``num_prompts / num_groups`` requests that add their own
  ``suffix_len``-token question; requests of all groups shuffled together;
- ``sharegpt``: the first human turn of each conversation of a ShareGPT-format JSON file, the output
  length taken from the answer's token count (or fixed).

Generated prompts are sequences of whole-word tokens (" apple", " river", ...) that the tokenizer maps
back to exactly the same ids, so a target given the text (an OpenAI server) and a target given the ids
(pdserve's gRPC gateway) see the same prompt of the same length.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DATASETS = ("random", "shared-prefix", "sharegpt")
_WORD = re.compile(r" [a-z]{2,}")


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    @property
    def vocab_size(self) -> int: ...


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload. ``prompt_ids`` is ``prompt`` tokenized (what a token-id target sends);
    ``system`` is the shared system prompt of a shared-prefix request (``prompt`` starts with it)."""

    prompt: str
    prompt_ids: tuple[int, ...]
    output_len: int
    system: str = ""
    group: int = -1

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


@dataclass(frozen=True)
class DatasetSpec:
    name: str = "random"
    num_prompts: int = 100
    seed: int = 0
    salt: int = 0  # changes the generated prompts' words, not their lengths (one per target of a round)
    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 0.0
    num_groups: int = 4
    prefix_len: int = 1024
    suffix_len: int = 64
    path: Path | None = None
    sharegpt_output_len: int | None = None
    max_prompt_len: int = 1024
    max_total_len: int = 2048


class WordVocabulary:
    """Token ids whose text is a single lower-case word with a leading space; any sequence of them
    re-tokenizes to itself (the pre-tokenizer splits at each space)."""

    def __init__(self, tokenizer: TextTokenizer):
        self.tokenizer = tokenizer
        self.ids = [i for i in range(tokenizer.vocab_size) if _WORD.fullmatch(tokenizer.decode([i]))]
        if not self.ids:
            raise ValueError("the tokenizer has no whole-word tokens to build prompts from")

    def sample(self, rng: random.Random, length: int) -> tuple[str, tuple[int, ...]]:
        ids = [rng.choice(self.ids) for _ in range(length)]
        text = self.tokenizer.decode(ids)
        if self.tokenizer.encode(text) != ids:
            raise ValueError(f"a generated prompt does not re-tokenize to itself: {text[:80]!r}")
        return text, tuple(ids)


def lengths(rng: random.Random, mean: int, range_ratio: float, count: int) -> list[int]:
    """``count`` integers uniform on ``[mean × (1 − r), mean × (1 + r)]``, at least 1."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    low, high = max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))
    return [rng.randint(low, high) for _ in range(count)]


def _word_rng(spec: DatasetSpec) -> random.Random:
    return random.Random(f"{spec.seed}:{spec.salt}") if spec.salt else random.Random(spec.seed)


def random_dataset(spec: DatasetSpec, vocab: WordVocabulary) -> list[BenchRequest]:
    rng = random.Random(spec.seed)
    inputs = lengths(rng, spec.input_len, spec.range_ratio, spec.num_prompts)
    outputs = lengths(rng, spec.output_len, spec.range_ratio, spec.num_prompts)
    words = _word_rng(spec) if spec.salt else rng
    requests = []
    for input_len, output_len in zip(inputs, outputs, strict=True):
        text, ids = vocab.sample(words, input_len)
        requests.append(BenchRequest(text, ids, output_len))
    return requests


def shared_prefix_dataset(spec: DatasetSpec, vocab: WordVocabulary) -> list[BenchRequest]:
    if spec.num_groups < 1 or spec.num_prompts % spec.num_groups:
        raise ValueError(f"num_prompts ({spec.num_prompts}) must be a multiple of num_groups ({spec.num_groups})")
    rng = _word_rng(spec)
    requests = []
    for group in range(spec.num_groups):
        system, system_ids = vocab.sample(rng, spec.prefix_len)
        for _ in range(spec.num_prompts // spec.num_groups):
            question, question_ids = vocab.sample(rng, spec.suffix_len)
            requests.append(BenchRequest(system + question, system_ids + question_ids, spec.output_len,
                                         system=system, group=group))
    random.Random(spec.seed).shuffle(requests)  # the same order of groups and lengths whatever the salt
    return requests


def sharegpt_dataset(spec: DatasetSpec, tokenizer: TextTokenizer) -> list[BenchRequest]:
    """First human turn → prompt, first answer's token count → output length (vLLM's filter: both at
    least 4 tokens, prompt ≤ ``max_prompt_len``, prompt + output ≤ ``max_total_len``)."""
    if spec.path is None:
        raise ValueError("the sharegpt dataset needs a path (--dataset-path)")
    conversations = json.loads(Path(spec.path).read_text())
    pairs = [(c["conversations"][0]["value"], c["conversations"][1]["value"])
             for c in conversations if len(c.get("conversations", ())) >= 2]
    random.Random(spec.seed).shuffle(pairs)
    requests = []
    for prompt, answer in pairs:
        if len(requests) == spec.num_prompts:
            break
        prompt_ids = tuple(tokenizer.encode(prompt))
        output_len = spec.sharegpt_output_len or len(tokenizer.encode(answer))
        if len(prompt_ids) < 4 or output_len < 4:
            continue
        if len(prompt_ids) > spec.max_prompt_len or len(prompt_ids) + output_len > spec.max_total_len:
            continue
        requests.append(BenchRequest(prompt, prompt_ids, output_len))
    if len(requests) < spec.num_prompts:
        raise ValueError(f"{spec.path} has only {len(requests)} usable conversations, {spec.num_prompts} asked for")
    return requests


def build_dataset(spec: DatasetSpec, tokenizer: TextTokenizer, vocab: WordVocabulary | None = None
                  ) -> list[BenchRequest]:
    """The workload ``spec`` names. Pass ``vocab`` to reuse one across calls (building it decodes the
    whole vocabulary)."""
    if spec.name == "sharegpt":
        return sharegpt_dataset(spec, tokenizer)
    vocab = vocab or WordVocabulary(tokenizer)
    if spec.name == "random":
        return random_dataset(spec, vocab)
    if spec.name == "shared-prefix":
        return shared_prefix_dataset(spec, vocab)
    raise ValueError(f"unknown dataset {spec.name!r} (one of {', '.join(DATASETS)})")
