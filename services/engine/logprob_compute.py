"""The logprobs of sampled tokens computed from a batch's logits (``logprobs.py`` has the types and the
contract: the raw distribution, before temperature, top-k/p and banned tokens).

:func:`logprob_tensors` runs where the logits are; :func:`logprob_entries` builds the entries from its
results once they are on the host (the engine moves them with the step's token ids, in one wait)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine.device_transfer import to_device, to_host
from services.engine.logprobs import TokenLogprobs


def logprob_tensors(logits: torch.Tensor, token_ids: torch.Tensor, k_max: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of each row of ``logits [n, V]``: the logprob of ``token_ids[i]`` ``[n]``, the ``k_max`` best
    logprobs and their ids ``[n, k_max]``, and the token's rank ``[n]`` (as vLLM: how many tokens are at
    least as likely, itself included), on the logits' device."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, token_ids.to(logprobs.device).unsqueeze(1)).squeeze(1)
    top_values, top_ids = logprobs.topk(k_max, dim=-1)
    ranks = (logprobs >= chosen.unsqueeze(1)).sum(dim=-1)
    return chosen, top_values, top_ids, ranks


def logprob_entries(token_ids: Sequence[int], chosen: torch.Tensor, top_values: torch.Tensor,
                    top_ids: torch.Tensor, ranks: torch.Tensor, ks: Sequence[int]) -> list[TokenLogprobs]:
    """One entry per row from :func:`logprob_tensors`' results on the host: the first ``ks[i]`` of row i's
    best."""
    chosen_values, values, ids, rank_of = chosen.tolist(), top_values.tolist(), top_ids.tolist(), ranks.tolist()
    return [TokenLogprobs(token_id, chosen_values[row], tuple(zip(ids[row][:k], values[row][:k], strict=True)),
                          rank_of[row])
            for row, (token_id, k) in enumerate(zip(token_ids, ks, strict=True))]


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], ks: Sequence[int]) -> list[TokenLogprobs]:
    """One entry per row of ``logits [n, V]``: the logprob of ``token_ids[i]`` and the ``ks[i]`` most
    likely tokens of that row."""
    assert logits.shape[0] == len(token_ids) == len(ks), "one token and one k per row"
    tensors = logprob_tensors(logits, to_device(list(token_ids), torch.long, logits.device), max(ks, default=0))
    return logprob_entries(token_ids, *to_host(*tensors), ks)
