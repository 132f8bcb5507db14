"""Batched token sampling: logit bias, penalties, greedy, temperature, min-p, top-k, top-p, per-request
seeded generators.

Random rows use the exponential-race form of categorical sampling (``argmax(p / E)`` with ``E ~ Exp(1)``),
which needs no sort. A seeded request draws the noise of its i-th output token from a generator seeded
with ``(seed, i)``, so it samples the same tokens whatever else shares its batch, whether or not it was
preempted and recomputed, and whichever node (prefill or decode) samples that position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from services.engine.penalties import History, apply_logit_bias, apply_min_p, apply_penalties
from services.engine.sampling_params import SamplingParams


def make_generator(params: SamplingParams, position: int = 0) -> torch.Generator | None:
    """The generator for output token ``position`` of a seeded request; None (global RNG) otherwise."""
    if params.greedy or params.seed is None:
        return None
    generator = torch.Generator()
    generator.manual_seed((params.seed * 1_000_003 + position) % 2**63)
    return generator


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None],
           banned: Sequence[Sequence[int]] | None = None,
           histories: Sequence[History | None] | None = None,
           allowed: Sequence[np.ndarray | None] | None = None) -> list[int]:
    """Pick one token per row of float32 ``logits [B, V]`` (changed in place); ``banned[i]`` lists ids row i
    may not take; ``histories[i]`` (prompt and output ids) is needed where ``params[i]`` has a penalty;
    ``allowed[i]`` (booleans over the vocabulary), where given, is the only ids row i may take (a grammar's
    mask: applied after the bias and penalties, before temperature, min-p, top-k and top-p, so no setting
    can bring a disallowed id back — every later step keeps ``-inf`` at ``-inf``)."""
    assert logits.shape[0] == len(params) == len(generators), "one params/generator per logits row"
    logits = logits.float()
    if any(p.logit_bias for p in params):
        apply_logit_bias(logits, params)
    if any(p.penalized for p in params):
        assert histories is not None, "penalized rows need their token histories"
        apply_penalties(logits, params, histories)
    if allowed is not None:
        for row, mask in enumerate(allowed):
            if mask is not None:
                logits[row].masked_fill_(~torch.from_numpy(mask[:logits.shape[1]]), float("-inf"))
    if banned is not None:
        for row, ids in enumerate(banned):
            if ids:
                logits[row, list(ids)] = float("-inf")
    chosen = logits.argmax(dim=-1)
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if random_rows:
        picked = _sample_random(logits[random_rows], [params[i] for i in random_rows],
                                [generators[i] for i in random_rows])
        chosen[random_rows] = picked
    return chosen.tolist()


def _sample_random(logits: torch.Tensor, params: Sequence[SamplingParams],
                   generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype).unsqueeze(1)
    logits = logits / temperature
    if any(p.min_p > 0 for p in params):
        logits = apply_min_p(logits, [p.min_p for p in params])
    top_k = [p.top_k for p in params]
    if any(k > 0 for k in top_k):
        logits = _apply_top_k(logits, top_k)
    if any(p.top_p < 1.0 for p in params):
        logits = _apply_top_p(logits, [p.top_p for p in params])
    probs = logits.softmax(dim=-1)
    noise = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        noise[row].exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def _apply_top_k(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    vocab = logits.shape[-1]
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_k])
    top_values = logits.topk(int(ks.max()), dim=-1).values
    threshold = top_values.gather(1, (ks - 1).unsqueeze(1))
    return logits.masked_fill(logits < threshold, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """Keep the smallest set of highest-probability tokens whose mass reaches ``top_p`` (at least one)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    p = torch.tensor(top_p, dtype=cumulative.dtype).unsqueeze(1)
    remove_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= p  # mass before this token already >= p
    remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
