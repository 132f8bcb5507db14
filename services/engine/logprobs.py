"""Log-probabilities of sampled tokens, as OpenAI's and vLLM's ``logprobs`` return them: the types.

They are the model's own distribution (``log_softmax`` of the raw logits, before temperature, top-k/p and
banned tokens — vLLM's default ``raw_logprobs``): the sampled token's, and the ``k`` most likely tokens'
(most likely first) when a request asks for ``logprobs = k``.

Plain Python (no torch): the control plane, the nodes and the gateway carry these. The computation on
logits lives in ``logprob_compute.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LOGPROBS = 20  # the most alternatives a request may ask for (OpenAI's limit)


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob) of the k most likely, most likely first
    rank: int = 0  # 1 = the most likely (tokens at least as likely, itself included); 0 = not known
