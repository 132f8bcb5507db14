"""The per-step plan of the pure-torch backend: index tensors and masks that every layer reuses.

Decode sequences (one new token) are batched into groups of similar length, each served by one
gather of whole KV blocks plus one batched attention; prefill sequences are served one by one.
Everything here is built from host-side lengths, so planning never waits on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.attention.base import kv_rows
from kernels.attention.metadata import AttentionMetadata

DEFAULT_GROUP_WASTE_TOKENS = 4096
"""Padding (in positions, summed over a group) beyond which decode sequences are split into length
groups. On CPU a group costs a fixed ~50-100 µs of op overhead; padded positions cost less than real
ones (padding reads one cached block), so splitting pays only for large paddings (measured)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class DecodeGroup:
    """Decode sequences attended together over ``num_blocks`` gathered blocks each (rows padded)."""

    seqs: list[int]
    seq_lens: list[int]
    token_index: torch.Tensor
    """``[n]`` positions of the group's query tokens among the step's tokens (group row order)."""
    block_index: torch.Tensor
    """``[n * num_blocks]`` physical blocks to gather, row-major; padding entries are arbitrary blocks."""
    num_blocks: int
    block_size: int
    valid: torch.Tensor
    """``[n, 1, 1, padded_len]`` bool, True at positions below the sequence's length."""
    pad_rows: torch.Tensor | None
    """Rows ``i * padded_len + pos`` (pos >= seq_len) of the gathered buffer, None when there are none."""
    starts: list[int] | None = None
    """The first position each sequence sees (a sliding window's, see :meth:`windowed`); None: 0."""
    _additive_masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)
    _windowed: dict[int, DecodeGroup] = field(default_factory=dict, repr=False)
    _value_rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return len(self.seqs)

    @property
    def padded_len(self) -> int:
        return self.num_blocks * self.block_size

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """``[n, 1, 1, padded_len]``: 0 where visible, -inf elsewhere."""
        mask = self._additive_masks.get(dtype)
        if mask is None:
            mask = torch.zeros(self.valid.shape, dtype=dtype, device=self.valid.device)
            mask.masked_fill_(~self.valid, float("-inf"))
            self._additive_masks[dtype] = mask
        return mask

    def windowed(self, window: int) -> DecodeGroup:
        """The group as a sliding-window layer attends it: each sequence's last ``window`` positions, from the
        blocks that hold them only (a window of 512 gathers at most 33 blocks of 16 at any context length).
        Positions are counted from the first block gathered (``seq_lens`` are lengths from there); ``valid``
        and ``starts`` exclude the positions of that block before the window. Built once per step and window."""
        if window >= max(self.seq_lens):
            return self
        if window not in self._windowed:
            bs, n, device = self.block_size, self.size, self.block_index.device
            firsts = torch.tensor([max(0, length - window) // bs for length in self.seq_lens])
            local = torch.tensor(self.seq_lens) - firsts * bs
            num_blocks = _ceil_div(int(local.max()), bs)
            columns = (firsts.view(n, 1) + torch.arange(num_blocks)).clamp(max=self.num_blocks - 1)
            block_index = self.block_index.view(n, self.num_blocks).gather(1, columns.to(device)).reshape(-1)
            pos = torch.arange(num_blocks * bs)
            valid = (pos < local.view(n, 1)) & (pos >= local.view(n, 1) - window)
            pad = (~valid).view(-1).nonzero().view(-1)
            self._windowed[window] = DecodeGroup(
                seqs=self.seqs, seq_lens=local.tolist(), token_index=self.token_index, block_index=block_index,
                num_blocks=num_blocks, block_size=bs, valid=valid.view(n, 1, 1, -1).to(device),
                pad_rows=pad.to(device) if pad.numel() else None,
                starts=(local - window).clamp(min=0).tolist())
        return self._windowed[window]

    def value_rows(self, num_kv_heads: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Embedding-bag indices and offsets over the cache viewed as ``[-1, head_dim]`` rows: bag
        ``(i, h, g)`` lists the V rows of head h at positions ``0..padded_len-1`` of sequence i;
        positions past its length point at position 0 (always written; its weight there is 0)."""
        key = (num_kv_heads, group_size)
        if key not in self._value_rows:
            bs, n, length = self.block_size, self.size, self.padded_len
            device = self.block_index.device
            pos = torch.arange(length, device=device)
            blocks = self.block_index.to(torch.int64).view(n, self.num_blocks)[:, pos // bs]
            token_rows = (blocks * 2 + 1) * bs + pos % bs
            token_rows = torch.where(self.valid.view(n, length), token_rows, token_rows[:, :1])
            heads = torch.arange(num_kv_heads, device=device).view(1, num_kv_heads, 1, 1)
            rows = token_rows.view(n, 1, 1, length) * num_kv_heads + heads
            rows = rows.expand(n, num_kv_heads, group_size, length).reshape(-1)
            offsets = torch.arange(0, rows.numel(), length, device=device)
            self._value_rows[key] = (rows, offsets)
        return self._value_rows[key]


@dataclass
class PrefillSeq:
    """One sequence with several new tokens, attended on its own."""

    token_start: int
    token_end: int
    seq_len: int
    block_index: torch.Tensor | None
    """Blocks holding positions ``offset..seq_len-1``; None when there is no cached prefix (the new K/V
    are used directly)."""
    allowed: torch.Tensor | None
    """``[query_len, seq_len]`` bool bottom-right causal mask; None when there is no cached prefix."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    offset: int = 0
    """The first position ``block_index`` holds (a multiple of the block size; > 0 only in :meth:`windowed`)."""
    _additive_masks: dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False)
    _windowed: dict[int, PrefillSeq] = field(default_factory=dict, repr=False)

    @property
    def context(self) -> int:
        """Positions already in the cache: the first query is at this position."""
        return self.seq_len - (self.token_end - self.token_start)

    def hides(self, window: int | None) -> bool:
        """Whether a sliding ``window`` hides some position from some query of this step."""
        return window is not None and window < self.seq_len

    def windowed(self, window: int, block_size: int) -> PrefillSeq:
        """The sequence as a sliding-window layer gathers it after a cached prefix: from the block holding the
        first position any of its queries sees (``context - window + 1``) on."""
        if self.block_index is None or not self.hides(window):
            return self
        if window not in self._windowed:
            first = max(0, self.context - window + 1) // block_size
            self._windowed[window] = PrefillSeq(self.token_start, self.token_end, self.seq_len,
                                                self.block_index[first:], None, self.device, first * block_size)
        return self._windowed[window]

    def additive_mask(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """``[query_len, seq_len - offset]``: 0 where query j (position ``context + j``) sees a position
        (causally, and within ``window`` of it when given), -inf elsewhere."""
        window = window if self.hides(window) else None
        assert self.allowed is not None or window is not None, "a prefill without cached prefix uses is_causal"
        mask = self._additive_masks.get((dtype, window))
        if mask is None:
            if window is None:
                allowed = self.allowed
            else:
                query_pos = torch.arange(self.context, self.seq_len).view(-1, 1)
                kv_pos = torch.arange(self.offset, self.seq_len).view(1, -1)
                allowed = ((kv_pos <= query_pos) & (kv_pos > query_pos - window)).to(self.device)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            mask.masked_fill_(~allowed, float("-inf"))
            self._additive_masks[(dtype, window)] = mask
        return mask


@dataclass
class StepPlan:
    num_tokens: int
    rows: torch.Tensor
    """``[T]`` K rows of the new tokens (see ``kernels.attention.base.kv_rows``)."""
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillSeq]
    decode_only_in_order: bool
    """True when the step is one decode group whose rows are the step's tokens in order, so the
    group's output is the step's output."""


def build_plan(meta: AttentionMetadata, group_waste_tokens: int = DEFAULT_GROUP_WASTE_TOKENS) -> StepPlan:
    waste_blocks = group_waste_tokens // meta.block_size
    groups = [_decode_group(meta, seqs) for seqs in _split_decode(meta, meta.decode_seqs, waste_blocks)]
    prefills = [_prefill_seq(meta, i) for i in meta.prefill_seqs]
    in_order = len(groups) == 1 and not prefills and groups[0].seqs == list(range(meta.num_seqs))
    return StepPlan(
        num_tokens=meta.num_tokens,
        rows=kv_rows(meta.slot_mapping, meta.block_size),
        decode_groups=groups,
        prefills=prefills,
        decode_only_in_order=in_order,
    )


def _split_decode(meta: AttentionMetadata, seqs: list[int], waste_blocks: int) -> list[list[int]]:
    """One group in batch order when padding to the longest wastes little, else greedy groups of
    sequences sorted by length, each padding at most ``waste_blocks`` blocks."""
    if not seqs:
        return []
    blocks = {i: _ceil_div(meta.seq_lens[i], meta.block_size) for i in seqs}
    widest = max(blocks.values())
    if len(seqs) * widest - sum(blocks.values()) <= waste_blocks:
        return [list(seqs)]
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in sorted(seqs, key=blocks.__getitem__):
        if current and (len(current) + 1) * blocks[i] - (used + blocks[i]) > waste_blocks:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += blocks[i]
    groups.append(current)
    return groups


def _decode_group(meta: AttentionMetadata, seqs: list[int]) -> DecodeGroup:
    device, bs = meta.device, meta.block_size
    lens = [meta.seq_lens[i] for i in seqs]
    num_blocks = _ceil_div(max(lens), bs)
    length = num_blocks * bs
    n = len(seqs)
    if seqs == list(range(meta.num_seqs)):
        tables = meta.block_tables[:, :num_blocks]
    else:
        tables = meta.block_tables[torch.tensor(seqs, device=device), :num_blocks]
    valid = torch.arange(length) < torch.tensor(lens).view(n, 1)
    pad = (~valid).view(-1).nonzero().view(-1)
    return DecodeGroup(
        seqs=seqs,
        seq_lens=lens,
        token_index=torch.tensor([meta.query_starts[i] for i in seqs], device=device),
        block_index=tables.reshape(-1),
        num_blocks=num_blocks,
        block_size=bs,
        valid=valid.view(n, 1, 1, length).to(device),
        pad_rows=pad.to(device) if pad.numel() else None,
    )


def _prefill_seq(meta: AttentionMetadata, i: int) -> PrefillSeq:
    start, end = meta.query_starts[i], meta.query_starts[i + 1]
    seq_len, context = meta.seq_lens[i], meta.context_lens[i]
    if context == 0:
        return PrefillSeq(start, end, seq_len, block_index=None, allowed=None, device=meta.device)
    query_pos = torch.arange(context, seq_len).view(-1, 1)
    allowed = torch.arange(seq_len).view(1, -1) <= query_pos
    blocks = meta.block_tables[i, : _ceil_div(seq_len, meta.block_size)]
    return PrefillSeq(start, end, seq_len, block_index=blocks, allowed=allowed.to(meta.device), device=meta.device)
