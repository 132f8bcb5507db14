"""Sampling penalties on a batch's logits, as vLLM applies them (``SamplingParams`` has the contract).

Per penalized row, over the vocabulary: the repetition penalty first (every token of the prompt or the
output: a positive logit divided by it, a negative one multiplied), then the frequency penalty times each
token's count in the output, then the presence penalty for each token the output holds. Rows without a
penalty are not touched, so a batch without any costs nothing. The penalties are applied in float32, each
setting taken as the 32-bit float the wire carries, so the mixed engine and the nodes agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine.sampling_params import SamplingParams, as_float32

History = tuple[Sequence[int], Sequence[int]]  # a request's prompt token ids, its output token ids so far


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams],
                    histories: Sequence[History | None]) -> None:
    """Penalize float32 ``logits [B, V]`` in place; ``histories[i]`` is needed where ``params[i].penalized``."""
    assert logits.dtype == torch.float32 and len(params) == len(histories) == logits.shape[0]
    vocab = logits.shape[1]
    for row, (p, history) in enumerate(zip(params, histories, strict=True)):
        if not p.penalized:
            continue
        assert history is not None, f"row {row} is penalized but has no token history"
        prompt, output = history
        generated = torch.tensor(list(output), dtype=torch.long)
        values = logits[row]
        if p.repetition_penalty != 1:
            seen = torch.zeros(vocab, dtype=torch.bool)
            seen[torch.tensor(list(prompt), dtype=torch.long)] = True
            seen[generated] = True
            penalty = as_float32(p.repetition_penalty)
            hit = values[seen]
            values[seen] = torch.where(hit > 0, hit / penalty, hit * penalty)
        if (p.frequency_penalty != 0 or p.presence_penalty != 0) and len(generated):
            counts = torch.bincount(generated, minlength=vocab).to(torch.float32)
            values -= as_float32(p.frequency_penalty) * counts
            values -= as_float32(p.presence_penalty) * (counts > 0).to(torch.float32)


def apply_min_p(logits: torch.Tensor, min_p: Sequence[float]) -> torch.Tensor:
    """Drop (to -inf) each row's tokens whose probability is below ``min_p`` times the row's largest."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * torch.tensor([as_float32(m) for m in min_p],
                                                                dtype=probs.dtype).unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))
