"""What one scheduler step tells an attention backend about its batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """One scheduler step's batch.

    Sequences appear in batch order; sequence i contributes ``query_lens[i]`` new tokens, which are the
    LAST ``query_lens[i]`` tokens of its ``seq_lens[i]`` tokens (cached/previously computed prefix
    first). Query tokens of all sequences are concatenated in that order.

    ``block_tables`` is ``[num_seqs, max_blocks]`` int32 on the KV device, rows padded with 0: entry j of
    row i is the physical block that holds positions ``j*block_size .. (j+1)*block_size - 1`` of
    sequence i. ``slot_mapping`` is ``[num_tokens]`` int64 on the same device:
    ``block_id * block_size + offset`` of each new token.

    The derived fields (``query_starts``, ``context_lens``, ``decode_seqs``, ``prefill_seqs``) are
    computed once here, on the host, so that backends never read device tensors back to plan a step.
    ``host_block_tables``, when given, is ``block_tables`` on the CPU (``build`` keeps it), for backends
    that plan from the page table on the host (FlashInfer).
    """

    query_lens: list[int]
    seq_lens: list[int]
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    block_size: int
    host_block_tables: torch.Tensor | None = None
    prompt_lens: list[int] | None = None
    """Optional: each sequence's prompt tokens. The deterministic backend runs a query row of a position
    below it (a prompt position) through its prompt kernel, every other row through its output kernel."""
    query_starts: list[int] = field(init=False)
    """``num_seqs + 1`` offsets: sequence i's query tokens are ``query_starts[i]:query_starts[i+1]``."""
    context_lens: list[int] = field(init=False)
    """Tokens of each sequence already in the cache before this step: ``seq_len - query_len``."""
    decode_seqs: list[int] = field(init=False)
    """Sequences with exactly one new token, in batch order."""
    prefill_seqs: list[int] = field(init=False)
    """Sequences with more than one new token, in batch order."""
    max_seq_len: int = field(init=False)
    """The longest sequence (0 without any): a sliding window at least this long hides nothing in the step."""

    def __post_init__(self) -> None:
        self.query_lens = [int(n) for n in self.query_lens]
        self.seq_lens = [int(n) for n in self.seq_lens]
        num_seqs = len(self.query_lens)
        if len(self.seq_lens) != num_seqs:
            raise ValueError(f"{num_seqs} query_lens but {len(self.seq_lens)} seq_lens")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        for i, (q, s) in enumerate(zip(self.query_lens, self.seq_lens, strict=True)):
            if not 1 <= q <= s:
                raise ValueError(f"sequence {i}: need 1 <= query_len <= seq_len, got {q} and {s}")
        if self.block_tables.dim() != 2 or self.block_tables.shape[0] != num_seqs:
            raise ValueError(f"block_tables must be [{num_seqs}, max_blocks], got {list(self.block_tables.shape)}")
        if num_seqs and self.block_tables.shape[1] * self.block_size < max(self.seq_lens):
            raise ValueError(
                f"block_tables has {self.block_tables.shape[1]} columns of {self.block_size} slots, "
                f"too few for seq_len {max(self.seq_lens)}"
            )
        if self.block_tables.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"block_tables must be int32 (or int64), got {self.block_tables.dtype}")
        host = self.host_block_tables
        if host is not None and (host.device.type != "cpu" or host.shape != self.block_tables.shape):
            raise ValueError(f"host_block_tables must be a CPU copy of block_tables {list(self.block_tables.shape)}, "
                             f"got {list(host.shape)} on {host.device}")
        if self.prompt_lens is not None and len(self.prompt_lens) != num_seqs:
            raise ValueError(f"{num_seqs} sequences but {len(self.prompt_lens)} prompt_lens")
        starts = [0]
        for q in self.query_lens:
            starts.append(starts[-1] + q)
        self.query_starts = starts
        if self.slot_mapping.dim() != 1 or self.slot_mapping.numel() != starts[-1]:
            raise ValueError(f"slot_mapping must be [{starts[-1]}], got {list(self.slot_mapping.shape)}")
        if self.slot_mapping.device != self.block_tables.device:
            raise ValueError("slot_mapping and block_tables must live on the same device")
        self.context_lens = [s - q for q, s in zip(self.query_lens, self.seq_lens, strict=True)]
        self.decode_seqs = [i for i, q in enumerate(self.query_lens) if q == 1]
        self.prefill_seqs = [i for i, q in enumerate(self.query_lens) if q > 1]
        self.max_seq_len = max(self.seq_lens, default=0)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return self.query_starts[-1]

    @property
    def device(self) -> torch.device:
        return self.block_tables.device

    def tables_on_host(self) -> torch.Tensor:
        """``block_tables`` on the CPU: ``host_block_tables`` when set, else the tensor itself on a CPU
        step, else a copy from the device (which waits for it)."""
        if self.host_block_tables is not None:
            return self.host_block_tables
        return self.block_tables if self.block_tables.device.type == "cpu" else self.block_tables.cpu()

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
        prompt_lens: list[int] | None = None,
    ) -> AttentionMetadata:
        """Pad the per-sequence block tables into an int32 tensor and derive the slot mapping.

        New token j of sequence i sits at position ``p = seq_lens[i] - query_lens[i] + j`` and goes to
        slot ``block_tables[i][p // block_size] * block_size + p % block_size``.
        """
        if len(seq_lens) != len(query_lens):
            raise ValueError(f"{len(query_lens)} query_lens but {len(seq_lens)} seq_lens")
        if len(block_tables) != len(query_lens):
            raise ValueError(f"{len(query_lens)} sequences but {len(block_tables)} block tables")
        for i, (table, s) in enumerate(zip(block_tables, seq_lens, strict=True)):
            if len(table) * block_size < s:
                raise ValueError(f"sequence {i}: {len(table)} blocks cannot hold {s} tokens")
        width = max((len(t) for t in block_tables), default=0)
        tables = torch.zeros(len(block_tables), max(width, 1), dtype=torch.int32)
        lengths = torch.tensor([len(t) for t in block_tables], dtype=torch.int64)
        filled = torch.arange(tables.shape[1]) < lengths[:, None]
        tables[filled] = torch.tensor([b for t in block_tables for b in t], dtype=torch.int32)
        q = torch.tensor(query_lens, dtype=torch.int64)
        s = torch.tensor(seq_lens, dtype=torch.int64)
        seq_of_token = torch.repeat_interleave(torch.arange(len(query_lens)), q)
        first_token = torch.cumsum(q, 0) - q
        positions = (s - q)[seq_of_token] + torch.arange(int(q.sum())) - first_token[seq_of_token]
        blocks = tables[seq_of_token, positions // block_size].to(torch.int64)
        slots = blocks * block_size + positions % block_size
        return cls(
            query_lens=list(query_lens),
            seq_lens=list(seq_lens),
            block_tables=tables.to(device),
            slot_mapping=slots.to(device),
            block_size=block_size,
            host_block_tables=tables,
            prompt_lens=None if prompt_lens is None else list(prompt_lens),
        )
