"""A step's sampling: one token per request that reached the end of its tokens, from the logits the model
left on its device, and the logprobs of the requests that ask for them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from services.engine.bad_words import bad_word_bans
from services.engine.device_transfer import to_device, to_host
from services.engine.logprob_compute import logprob_entries, logprob_tensors
from services.engine.logprobs import TokenLogprobs
from services.engine.request import Request
from services.engine.sampler import make_generator, sample_ids
from services.engine.sampling_params import SamplingParams
from services.engine.structured.masking import allowed_tokens


@dataclass
class StepSamples:
    """What a step sampled: a token per request that reached the end of its tokens, and the logprobs of
    those whose requests ask for them. ``completed``: constrained requests whose grammar the token ended
    (nothing more may follow); ``grammar_errors``: constrained requests whose grammar could not go on
    (the message), aborted by the engine."""

    tokens: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    completed: set[str] = field(default_factory=set)
    grammar_errors: dict[str, str] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # this step's prompt rows
    embeddings: dict[str, list[float]] = field(default_factory=dict)  # embedding requests' final hidden rows


def sample_step(logits: torch.Tensor, requests: Sequence[Request]) -> StepSamples:
    """Row i of ``logits [B, V]`` (on the model's device) is ``requests[i]``'s next-token distribution.

    Every row is sampled where the logits are (:func:`sampler.sample_ids`), and only the step's token ids
    cross to the host, in one copy: on a GPU, a batch of 128 rows of a 128k vocabulary copies 1 KB, not
    64 MB, whatever its rows ask for. Plain greedy rows (no logit bias, penalty, banned id, grammar or
    logprobs) take their argmax directly; the others go through the whole sampler. Either way a greedy
    token is the same: float32 holds every bf16/fp16 logit exactly, and ties go to the first index on every
    device. The logprobs a request asks for are computed there too, and only their values cross.

    A constrained row (``sampling.structured``): its grammar's mask (filled meanwhile by
    ``structured.masking``, on the host) crosses to the device and leaves only allowed tokens, after the
    bias and penalties and before temperature, min-p, top-k and top-p, so nothing else can bring a
    disallowed token back. Its logprobs are the model's raw distribution, as for any row. Where the grammar
    allows nothing but ids the request bans (its EOS or stop tokens before ``min_tokens``), the grammar
    wins."""
    banned = [banned_ids(r) for r in requests]
    plain: list[int] = []
    rest: list[int] = []
    for i, request in enumerate(requests):
        (plain if _plain_greedy(request.sampling) and not banned[i] else rest).append(i)
    samples = StepSamples()
    device = logits.device
    if not rest:
        (ids,) = to_host(logits.argmax(dim=-1))
        samples.tokens = {r.request_id: t for r, t in zip(requests, ids.tolist(), strict=True)}
        return samples
    ids = torch.empty(len(requests), dtype=torch.long, device=device)
    if plain:
        plain_rows = to_device(plain, torch.long, device)
        ids.index_copy_(0, plain_rows, logits.index_select(0, plain_rows).argmax(dim=-1))
    others = [requests[i] for i in rest]
    rest_rows = to_device(rest, torch.long, device)
    rows = logits if len(rest) == len(requests) else logits.index_select(0, rest_rows)
    wanted = [j for j, r in enumerate(others) if r.sampling.logprobs is not None]
    wanted_rows = to_device(wanted, torch.long, device) if wanted else None
    raw = rows.index_select(0, wanted_rows) if wanted else None  # a copy, before sample_ids bans tokens in place
    generators = [make_generator(r.sampling, r.num_output_tokens, device) for r in others]
    histories = [(r.distinct_prompt_ids, r.output_token_ids) if r.sampling.penalized else None for r in others]
    bans = [banned[i] for i in rest]
    masks = _masks(others, bans, samples, logits.shape[1])
    picked = sample_ids(rows, [r.sampling for r in others], generators, bans, histories, masks)
    ids.index_copy_(0, rest_rows, picked)
    ks = [others[j].sampling.logprobs for j in wanted]
    extra = logprob_tensors(raw, picked.index_select(0, wanted_rows), max(ks)) if wanted else ()
    ids, *extra = to_host(ids, *extra)  # the step's one wait for the device
    tokens = ids.tolist()
    samples.tokens = {r.request_id: t for r, t in zip(requests, tokens, strict=True)}
    if wanted:
        entries = logprob_entries([tokens[rest[j]] for j in wanted], *extra, ks)
        samples.logprobs = {others[j].request_id: entry for j, entry in zip(wanted, entries, strict=True)}
    _advance_grammars(requests, samples)
    return samples


def _masks(requests: Sequence[Request], bans: list[tuple[int, ...]], samples: StepSamples,
           vocab: int) -> list[np.ndarray | None] | None:
    """Each constrained row's allowed tokens (None for free rows): its grammar's and its
    ``allowed_token_ids``, both; ``bans`` of a row whose mask allows nothing else are dropped. A row whose
    grammar could not give a mask is recorded in ``samples.grammar_errors``."""
    if not any(r.sampling.structured is not None or r.sampling.allowed_token_ids for r in requests):
        return None
    masks: list[np.ndarray | None] = []
    for j, request in enumerate(requests):
        allowed = allowed_tokens(request) if request.sampling.structured is not None else None
        if isinstance(allowed, str):
            samples.grammar_errors[request.request_id] = allowed
            allowed = None
        if request.sampling.allowed_token_ids:
            listed = _listed(request, vocab)
            both = None if allowed is None else allowed[:vocab] & listed
            if both is not None and not both.any():  # the request ends (as on any grammar error); the row
                samples.grammar_errors[request.request_id] = "the grammar allows none of allowed_token_ids"
            allowed = both if both is not None and both.any() else listed  # samples a listed id meanwhile
        if allowed is not None and bans[j] and not np.delete(allowed, list(bans[j])).any():
            bans[j] = ()  # the grammar wins: e.g. it can only end, before min_tokens
        masks.append(allowed)
    return masks


def _listed(request: Request, vocab: int) -> np.ndarray:
    """The mask of the request's ``allowed_token_ids``: built at its first step, kept on the request (read
    only; gone with it)."""
    mask = request.allowed_mask
    if mask is None or len(mask) != vocab:
        mask = np.zeros(vocab, dtype=bool)
        mask[list(request.sampling.allowed_token_ids)] = True
        mask.flags.writeable = False
        request.allowed_mask = mask
    return mask


def _advance_grammars(requests: Sequence[Request], samples: StepSamples) -> None:
    for request in requests:
        rid = request.request_id
        if request.sampling.structured is None or rid in samples.grammar_errors:
            continue
        state = request.structured
        if not state.advance(samples.tokens[rid]):
            samples.grammar_errors[rid] = f"the grammar refused the sampled token: {state.error}"
        elif state.complete:
            samples.completed.add(rid)


def banned_ids(request: Request) -> tuple[int, ...]:
    """Ids ``request`` may not sample now: the last token of a bad word the output would complete, and its stop
    tokens (and EOS, unless ignored) before ``min_tokens``."""
    params = request.sampling
    words = bad_word_bans(request.bad_word_ids, request.output_token_ids) if request.bad_word_ids else ()
    if request.num_output_tokens >= params.min_tokens:
        return words
    return (*words, *params.stop_token_ids, *(() if params.ignore_eos else request.eos_token_ids))


def _plain_greedy(params: SamplingParams) -> bool:
    return (params.greedy and not params.logit_bias and not params.penalized and params.logprobs is None
            and params.structured is None and not params.allowed_token_ids)
