"""Log-probabilities of sampled tokens, as OpenAI's and vLLM's ``logprobs`` return them.

They are the model's own distribution (``log_softmax`` of the raw logits, before temperature, top-k/p and
banned tokens — vLLM's default ``raw_logprobs``): the sampled token's, and the ``k`` most likely tokens'
(most likely first) when a request asks for ``logprobs = k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_LOGPROBS = 20  # the most alternatives a request may ask for (OpenAI's limit)


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob) of the k most likely, most likely first


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], ks: Sequence[int]) -> list[TokenLogprobs]:
    """One entry per row of ``logits [n, V]``: the logprob of ``token_ids[i]`` and the ``ks[i]`` most
    likely tokens of that row."""
    assert logits.shape[0] == len(token_ids) == len(ks), "one token and one k per row"
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(list(token_ids), dtype=torch.long).unsqueeze(1)).squeeze(1).tolist()
    k_max = max(ks, default=0)
    top_values, top_ids = (logprobs.topk(k_max, dim=-1) if k_max else (None, None))
    out = []
    for row, (token_id, k) in enumerate(zip(token_ids, ks, strict=True)):
        top: tuple[tuple[int, float], ...] = ()
        if k:
            top = tuple(zip(top_ids[row, :k].tolist(), top_values[row, :k].tolist(), strict=True))
        out.append(TokenLogprobs(token_id, chosen[row], top))
    return out
