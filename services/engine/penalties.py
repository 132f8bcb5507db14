"""Logit bias and sampling penalties on a batch's logits, as vLLM applies them (``SamplingParams`` has the
contract). The bias comes first: each biased token's logit plus its bias.

Per penalized row: the repetition penalty first (every token of the prompt or the output: a positive logit
divided by it, a negative one multiplied), then the frequency penalty times each token's count in the
output, then the presence penalty for each token the output holds. Only the tokens of the history are read
and written (not the whole vocabulary), and rows without a penalty are not touched, so a batch without any
costs nothing (32 rows with all three penalties, 512-token prompts and 128 tokens out: ~1.2 ms a step on
this 2-core machine, 4096-token prompts ~7 ms, beside ~21 ms for a 32-row step). The penalties are applied
in float32, each setting taken as the 32-bit float the wire carries, so the mixed engine and the nodes
agree bit for bit.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from services.engine.device_transfer import to_device
from services.engine.sampling_params import SamplingParams, as_float32

# a request's prompt token ids (Request.distinct_prompt_ids: each once, built once), its output token ids so far
History = tuple[Sequence[int], Sequence[int]]


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams],
                    histories: Sequence[History | None]) -> None:
    """Penalize float32 ``logits [B, V]`` in place; ``histories[i]`` is needed where ``params[i].penalized``.

    Row by row in numpy, on a view of the logits: each row touches a few thousand entries at most, which
    torch's indexing would spread over its threads (under load, 32 rows of 4096-token prompts took 49 ms a
    step on 2 threads against 11 ms on one)."""
    assert logits.dtype == torch.float32 and len(params) == len(histories) == logits.shape[0]
    table = logits.numpy()  # shares the tensor's memory
    for row, (p, history) in enumerate(zip(params, histories, strict=True)):
        if not p.penalized:
            continue
        assert history is not None, f"row {row} is penalized but has no token history"
        prompt, output = history
        values = table[row]
        if p.repetition_penalty != 1:  # a token in both the prompt and the output is written twice, alike
            seen = np.concatenate([id_array(prompt), id_array(output)]) if output else id_array(prompt)
            hit = values[seen]
            penalty = np.float32(as_float32(p.repetition_penalty))
            values[seen] = np.where(hit > 0, hit / penalty, hit * penalty)
        if (p.frequency_penalty != 0 or p.presence_penalty != 0) and output:
            counts = Counter(output)
            generated = id_array(counts.keys())
            times = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
            values[generated] = values[generated] - np.float32(as_float32(p.frequency_penalty)) * times \
                - np.float32(as_float32(p.presence_penalty))  # frequency, then presence: two roundings, as vLLM's


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """Add each row's ``logit_bias`` to float32 ``logits [B, V]`` in place (a token listed twice gets both)."""
    assert logits.dtype == torch.float32 and len(params) == logits.shape[0]
    table = logits.numpy()  # shares the tensor's memory
    for row, p in enumerate(params):
        if p.logit_bias:
            ids = np.fromiter((token_id for token_id, _ in p.logit_bias), dtype=np.int64, count=len(p.logit_bias))
            biases = np.fromiter((bias for _, bias in p.logit_bias), dtype=np.float32, count=len(p.logit_bias))
            np.add.at(table[row], ids, biases)  # each bias as the float32 the wire carries


def id_array(token_ids: Iterable[int]) -> np.ndarray:
    """Token ids as int64 (an ``array("q")`` is read in place)."""
    if isinstance(token_ids, array):
        return np.frombuffer(token_ids, dtype=np.int64)
    return np.fromiter(token_ids, dtype=np.int64)


def apply_min_p(logits: torch.Tensor, min_p: Sequence[float]) -> torch.Tensor:
    """Drop (to -inf) each row's tokens whose probability is below ``min_p`` times the row's largest."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * to_device([as_float32(m) for m in min_p], probs.dtype,
                                                             probs.device).unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))
