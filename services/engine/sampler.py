"""Batched token sampling: logit bias, penalties, greedy, temperature, min-p, top-k, top-p, per-request
seeded generators.

Random rows use the exponential-race form of categorical sampling (``argmax(p / E)`` with ``E ~ Exp(1)``),
which needs no sort. A seeded request draws the noise of its i-th output token from a generator seeded
with ``(seed, i)``, so it samples the same tokens whatever else shares its batch, whether or not it was
preempted and recomputed, and whichever node (prefill or decode) samples that position.

Everything runs where the logits are: on a GPU no row's logits cross to the host, only the chosen ids (one
copy per step). The seeded noise then comes from a generator on that device, so a seed reproduces its
tokens on one kind of device (CPU, or one GPU model), not across kinds — as in vLLM. On a CPU the bias and
penalties run in numpy on a view (:mod:`penalties`), elsewhere as batched index ops
(:mod:`device_penalties`); both give the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from services.engine.device_penalties import apply_logit_bias_batched, apply_penalties_batched
from services.engine.device_transfer import to_device
from services.engine.penalties import History, apply_logit_bias, apply_min_p, apply_penalties
from services.engine.sampling_params import SamplingParams


def make_generator(params: SamplingParams, position: int = 0,
                   device: torch.device | str = "cpu") -> torch.Generator | None:
    """The generator on ``device`` for output token ``position`` of a seeded request; None (the device's
    global RNG) otherwise."""
    if params.greedy or params.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed((params.seed * 1_000_003 + position) % 2**63)
    return generator


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None],
           banned: Sequence[Sequence[int]] | None = None,
           histories: Sequence[History | None] | None = None,
           allowed: Sequence[np.ndarray | None] | None = None) -> list[int]:
    """:func:`sample_ids`, the ids on the host."""
    return sample_ids(logits, params, generators, banned, histories, allowed).tolist()


def sample_ids(logits: torch.Tensor, params: Sequence[SamplingParams],
               generators: Sequence[torch.Generator | None],
               banned: Sequence[Sequence[int]] | None = None,
               histories: Sequence[History | None] | None = None,
               allowed: Sequence[np.ndarray | None] | None = None) -> torch.Tensor:
    """Pick one token per row of float32 ``logits [B, V]`` (changed in place), on their device: the ids as
    an int64 tensor there. ``generators[i]`` (on that device) serves a seeded random row; ``banned[i]``
    lists ids row i may not take; ``histories[i]`` (prompt and output ids) is needed where ``params[i]`` has
    a penalty; ``allowed[i]`` (booleans over the vocabulary), where given, is the only ids row i may take
    (a grammar's mask: applied after the bias and penalties, before temperature, min-p, top-k and top-p, so
    no setting can bring a disallowed id back — every later step keeps ``-inf`` at ``-inf``)."""
    assert logits.shape[0] == len(params) == len(generators), "one params/generator per logits row"
    logits = logits.float()
    on_host = logits.device.type == "cpu"
    if any(p.logit_bias for p in params):
        (apply_logit_bias if on_host else apply_logit_bias_batched)(logits, params)
    if any(p.penalized for p in params):
        assert histories is not None, "penalized rows need their token histories"
        (apply_penalties if on_host else apply_penalties_batched)(logits, params, histories)
    if allowed is not None:
        _keep_allowed(logits, allowed)
    if banned is not None:
        _ban(logits, banned)
    chosen = logits.argmax(dim=-1)
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if random_rows:
        rows = _index(random_rows, logits.device)
        picked = _sample_random(logits.index_select(0, rows), [params[i] for i in random_rows],
                                [generators[i] for i in random_rows])
        chosen.index_copy_(0, rows, picked)
    return chosen


def _keep_allowed(logits: torch.Tensor, allowed: Sequence[np.ndarray | None]) -> None:
    """``-inf`` at every id a constrained row's mask disallows: the masks cross to the device in one copy."""
    constrained = [row for row, mask in enumerate(allowed) if mask is not None]
    if not constrained:
        return
    vocab = logits.shape[1]
    masks = to_device(np.stack([allowed[row][:vocab] for row in constrained]), torch.bool, logits.device)
    rows = _index(constrained, logits.device)
    logits.index_copy_(0, rows, logits.index_select(0, rows).masked_fill_(~masks, float("-inf")))


def _ban(logits: torch.Tensor, banned: Sequence[Sequence[int]]) -> None:
    rows = [row for row, ids in enumerate(banned) for _ in ids]
    if rows:
        ids = [token_id for token_ids in banned for token_id in token_ids]
        minus_inf = torch.full((len(rows),), float("-inf"), device=logits.device)  # no host scalar to copy
        logits.index_put_((_index(rows, logits.device), _index(ids, logits.device)), minus_inf)


def _index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.long, device)


def _sample_random(logits: torch.Tensor, params: Sequence[SamplingParams],
                   generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    device = logits.device
    temperature = to_device([p.temperature for p in params], logits.dtype, device)
    logits = logits / temperature.unsqueeze(1)
    if any(p.min_p > 0 for p in params):
        logits = apply_min_p(logits, [p.min_p for p in params])
    top_k = [p.top_k for p in params]
    if any(k > 0 for k in top_k):
        logits = _apply_top_k(logits, top_k)
    if any(p.top_p < 1.0 for p in params):
        logits = _apply_top_p(logits, [p.top_p for p in params])
    probs = logits.softmax(dim=-1)
    return (probs / _exponential_noise(probs, generators)).argmax(dim=-1)


def _exponential_noise(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """``Exp(1)`` noise shaped as ``probs``: a seeded row's from its own generator (one fill per row, so its
    draws do not depend on the batch), the other rows' from the device's global RNG in one fill."""
    noise = torch.empty_like(probs)
    if any(generator is None for generator in generators):
        noise.exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    return noise


def _apply_top_k(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Keep each row's ``top_k`` best (ties at the k-th kept); a row without top-k (0, or at least the
    vocabulary) keeps all, and costs no sort past the other rows' largest k."""
    vocab = logits.shape[-1]
    limited = [0 < k < vocab for k in top_k]
    k_max = max((k for k, on in zip(top_k, limited, strict=True) if on), default=0)
    if not k_max:
        return logits
    ks = [k if on else k_max for k, on in zip(top_k, limited, strict=True)]
    top_values = logits.topk(k_max, dim=-1).values
    threshold = top_values.gather(1, (_index(ks, logits.device) - 1).unsqueeze(1))
    if not all(limited):
        threshold = threshold.masked_fill(~to_device(limited, torch.bool, logits.device).unsqueeze(1), float("-inf"))
    return logits.masked_fill(logits < threshold, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """Keep the smallest set of highest-probability tokens whose mass reaches ``top_p`` (at least one); a
    row whose ``top_p`` is 1 keeps every token (its cumulative sum could round past 1 before the tail)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    cumulative = probs.cumsum(dim=-1)
    p = to_device(top_p, cumulative.dtype, logits.device).unsqueeze(1)
    remove_sorted = ((cumulative - probs) >= p) & (p < 1)  # mass before this token already >= p
    remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
