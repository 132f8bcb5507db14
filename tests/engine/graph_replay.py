"""Decode-graph replays beside the eager forward, for tests: the same random context in both runners' pools,
then for each row count a replay of ``rows`` decoding sequences and the eager forward's logits for them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from kernels.attention.metadata import AttentionMetadata
from services.engine.model.decoder import DecoderModel
from services.engine.model_runner import ModelRunner

TABLES = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
SEQ_LENS = [9, 6, 13, 2]
"""Four sequences' block tables and lengths (blocks of 4 tokens; blocks 1..10 hold the random context)."""


def replays_beside_eager(graphed: ModelRunner, eager: ModelRunner, eager_model: DecoderModel,
                         row_counts: Iterable[int], block_size: int
                         ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(rows, replayed logits, eager logits)`` for each of ``row_counts`` (at most 4)."""
    device = eager_model.device
    gen = torch.Generator().manual_seed(0)
    context = torch.randn(graphed.kv_cache[:, :32].shape, generator=gen).to(device, graphed.kv_cache.dtype)
    for runner in (graphed, eager):
        runner.kv_cache[:, :32].copy_(context)
    for rows in row_counts:
        ids = torch.randint(0, eager_model.config.vocab_size, (rows,), generator=gen).tolist()
        positions = [s - 1 for s in SEQ_LENS[:rows]]
        got = graphed.graphs.run(ids, positions, SEQ_LENS[:rows], TABLES[:rows]).clone()
        eager.attention.plan(AttentionMetadata.build([1] * rows, SEQ_LENS[:rows], TABLES[:rows], block_size,
                                                     device.type))
        with torch.inference_mode():
            want = eager_model.forward(torch.tensor(ids, device=device), torch.tensor(positions, device=device),
                                       eager.kv_layers, eager.attention, torch.arange(rows, device=device))
        yield rows, got, want
