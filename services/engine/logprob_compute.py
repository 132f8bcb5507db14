"""The logprobs of sampled tokens computed from a batch's logits (``logprobs.py`` has the types and the
contract: the raw distribution, before temperature, top-k/p and banned tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine.logprobs import TokenLogprobs


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int] | torch.Tensor,
                   ks: Sequence[int]) -> list[TokenLogprobs]:
    """One entry per row of ``logits [n, V]``: the logprob of ``token_ids[i]`` and the ``ks[i]`` most
    likely tokens of that row. Computed where the logits are (``token_ids`` may be a tensor there); only
    the chosen and top-k values and ids cross to the host."""
    assert logits.shape[0] == len(token_ids) == len(ks), "one token and one k per row"
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if not isinstance(token_ids, torch.Tensor):
        token_ids = torch.tensor(list(token_ids), dtype=torch.long)
    token_ids = token_ids.to(logprobs.device)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    k_max = max(ks, default=0)
    top_values, top_ids = (logprobs.topk(k_max, dim=-1) if k_max else (None, None))
    if top_values is not None:
        top_values, top_ids = top_values.cpu(), top_ids.cpu()
    token_ids, chosen = token_ids.tolist(), chosen.tolist()
    out = []
    for row, (token_id, k) in enumerate(zip(token_ids, ks, strict=True)):
        top: tuple[tuple[int, float], ...] = ()
        if k:
            top = tuple(zip(top_ids[row, :k].tolist(), top_values[row, :k].tolist(), strict=True))
        out.append(TokenLogprobs(token_id, chosen[row], top))
    return out
