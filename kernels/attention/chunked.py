"""Chunked attention (Llama 4's rotated layers): a query at position ``p`` sees the positions of its own chunk of
``chunk`` tokens only, ``p - p % chunk .. p`` (transformers' chunked causal mask; llama.cpp's
``LLAMA_SWA_TYPE_CHUNKED``).

Any backend serves it, as vLLM's local attention does, through a second plan of the step: :func:`chunked_metadata`
cuts each sequence's new tokens at chunk boundaries into *virtual* sequences, each of which starts at its chunk's
first position (its page table is the sequence's from that chunk's first block on). Causal attention over a
virtual sequence is chunked attention over the real one. The new tokens keep their order and their slots, so the
layer's output rows and KV writes are the real step's. :class:`ChunkedAttention` holds two backends of one kind,
one planned on the step and one on its virtual sequences, and sends each layer to one of them by its ``chunk``.

A chunk must be a whole number of blocks (Llama 4's 8192 is, at every block size pdserve takes).
"""

from __future__ import annotations

import torch

from kernels.attention.base import AttentionBackend
from kernels.attention.metadata import AttentionMetadata


def chunked_metadata(meta: AttentionMetadata, chunk: int) -> AttentionMetadata:
    """``meta``'s step as chunked layers attend it: each sequence's new tokens split at multiples of ``chunk``,
    each piece a sequence that starts at its chunk's first position. ``meta`` itself when no sequence is longer
    than a chunk (every query then sees its whole causal context)."""
    block_size = meta.block_size
    if chunk < 1 or chunk % block_size:
        raise ValueError(f"an attention chunk must be a positive multiple of the block size {block_size}, "
                         f"got {chunk}")
    if meta.max_seq_len <= chunk:
        return meta
    query_lens: list[int] = []
    seq_lens: list[int] = []
    rows: list[int] = []  # the real sequence of each virtual one
    first_blocks: list[int] = []  # the block its chunk starts at
    prompt_lens: list[int] | None = None if meta.prompt_lens is None else []
    for seq, (position, end) in enumerate(zip(meta.context_lens, meta.seq_lens, strict=True)):
        while position < end:
            start = position - position % chunk
            stop = min(end, start + chunk)
            query_lens.append(stop - position)
            seq_lens.append(stop - start)
            rows.append(seq)
            first_blocks.append(start // block_size)
            if prompt_lens is not None:
                assert meta.prompt_lens is not None
                prompt_lens.append(max(0, meta.prompt_lens[seq] - start))
            position = stop
    host = meta.tables_on_host()
    width = max(-(-n // block_size) for n in seq_lens)
    columns = (torch.tensor(first_blocks)[:, None] + torch.arange(width)).clamp(max=host.shape[1] - 1)
    tables = host[torch.tensor(rows)[:, None], columns]  # past a virtual sequence's length: never read
    return AttentionMetadata(query_lens=query_lens, seq_lens=seq_lens, block_tables=tables.to(meta.device),
                             slot_mapping=meta.slot_mapping, block_size=block_size, host_block_tables=tables,
                             prompt_lens=prompt_lens)


class ChunkedAttention(AttentionBackend):
    """``full`` for every layer but those whose ``forward`` is given ``chunk=C``, which go to ``local`` (a second
    backend of the same kind) planned on :func:`chunked_metadata` of the step. Takes the options ``full`` takes;
    one chunk size per model."""

    def __init__(self, full: AttentionBackend, local: AttentionBackend, chunk: int):
        if type(full) is not type(local):
            raise TypeError(f"the chunked layers' backend ({local.name}) must be the full layers' ({full.name})")
        self.full, self.local, self.chunk = full, local, chunk
        self.name = full.name  # reports as the backend it wraps
        self.supports_window = full.supports_window
        self.supports_sinks = full.supports_sinks
        self.supports_softcap = full.supports_softcap
        self._local_is_full = False

    def plan(self, meta: AttentionMetadata) -> None:
        self.full.plan(meta)
        local = chunked_metadata(meta, self.chunk)
        self._local_is_full = local is meta  # no sequence outgrows a chunk: the full plan serves both
        if not self._local_is_full:
            self.local.plan(local)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float,
                chunk: int | None = None, **options: object) -> torch.Tensor:
        if chunk is not None and chunk != self.chunk:
            raise ValueError(f"this attention was built for chunks of {self.chunk}, a layer asked for {chunk}")
        backend = self.local if chunk is not None and not self._local_is_full else self.full
        return backend.forward(q, k, v, kv_cache, scale, **options)  # type: ignore[call-arg]
