"""CPU paged attention whose result for a query does not depend on the step it runs in (deterministic mode).

The default CPU backend (``cpu_native``) serves decode rows with the C kernel, which splits a sequence's
KV across threads when there are few sequences (so a row's reduction order depends on the batch size), and
prefill rows with torch's ``scaled_dot_product_attention`` (another kernel, another order, which also
changes with the chunk and with a prefix hit). This backend instead writes the step's K/V into the cache
first, then runs each query row by the kind of position it computes (``AttentionMetadata.prompt_lens``):

- a prompt position through ``prefill_fixed.c``: tiles of 16 slots from slot 0, fp32 sums and online
  softmax (on AMX tiles where the CPU has them), up to 32 consecutive rows of a prompt sharing each tile's
  K/V, with no row's operations depending on the others, the chunk's start or the thread;
- an output position (every row when ``prompt_lens`` is not given) through the decode kernel as a
  sequence of its own (length = its position + 1) without split-KV: blocks and tiles ascending.

A position's kind belongs to its request, never to its step, so each row sums its positions in one order
whatever shares its step, where its chunk starts, whether its request was recomputed, or which node runs
it. The two kernels give a row different bits; no row ever moves from one to the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kernels.attention.base import AttentionBackend, kv_rows, write_kv_rows
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.native_cpu import NATIVE_DTYPES, _library
from kernels.attention.registry import BackendUnavailableError


class FixedOrderCpuAttention(AttentionBackend):
    """Prompt rows through the C prompt kernel, output rows through the C decode kernel as sequences of their
    own (rows in parallel, ``torch.get_num_threads()`` threads). Needs a CPU, a contiguous bf16/fp32 cache and
    a shape the kernels serve; anything else is refused (``ValueError``) rather than served with another
    reduction order."""

    name: ClassVar[str] = "cpu_fixed_order"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if self.device.type != "cpu":
            raise BackendUnavailableError(f"attention backend {self.name!r} runs on CPU only, not {self.device}")
        self._library = _library()
        self._plan: _Plan | None = None

    @classmethod
    def check_available(cls) -> None:
        _library()

    def plan(self, meta: AttentionMetadata) -> None:
        prompt_index, prompt_seq, prompt_len, output_index, output_seq, output_len = [], [], [], [], [], []
        for i, (query_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens, strict=True)):
            prompt_end = meta.prompt_lens[i] if meta.prompt_lens is not None else 0
            for j, position in enumerate(range(seq_len - query_len, seq_len)):
                index, seq, lens = ((prompt_index, prompt_seq, prompt_len) if position < prompt_end
                                    else (output_index, output_seq, output_len))
                index.append(meta.query_starts[i] + j)
                seq.append(i)
                lens.append(position + 1)
        widest = -(-max(meta.seq_lens) // meta.block_size) if meta.seq_lens else 1
        tables = meta.tables_on_host()[:, :widest].to(torch.int32).contiguous()
        rows = kv_rows(meta.slot_mapping.cpu(), meta.block_size).contiguous()
        lowest = int(tables.min()) if tables.numel() else 0
        if lowest < 0:
            raise ValueError(f"negative block in the step's metadata ({lowest})")
        highest = int(tables.max()) if tables.numel() else 0
        if meta.num_tokens:
            highest = max(highest, int(meta.slot_mapping.max()) // meta.block_size)
        self._plan = _Plan(
            num_tokens=meta.num_tokens, block_size=meta.block_size, rows=rows, tables=tables,
            highest_block=highest,
            prompt=_Rows.of(prompt_index, prompt_seq, prompt_len, meta.num_tokens),
            output=_Rows.of(output_index, output_seq, output_len, meta.num_tokens, tables),
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        plan = self._plan
        if plan is None:
            raise RuntimeError("FixedOrderCpuAttention.forward called before plan()")
        num_tokens, num_heads, head_dim = q.shape
        if num_tokens != plan.num_tokens:
            raise ValueError(f"planned {plan.num_tokens} tokens, got q of {num_tokens}")
        self._check(q, kv_cache, plan)
        write_kv_rows(kv_cache, k, v, plan.rows)
        q = q.contiguous()
        out = torch.empty_like(q)
        for rows, run in ((plan.prompt, self._prompt), (plan.output, self._output)):
            if rows is None:
                continue
            if rows.index is None:  # every row of the step
                run(q, out, rows, plan, kv_cache, scale)
            else:
                part = torch.empty(rows.index.numel(), num_heads, head_dim, dtype=q.dtype)
                run(q.index_select(0, rows.index), part, rows, plan, kv_cache, scale)
                out.index_copy_(0, rows.index, part)
        return out

    def _prompt(self, q, out, rows: _Rows, plan: _Plan, kv_cache: torch.Tensor, scale: float) -> None:
        kernel = self._library.prefill_fixed_bf16 if q.dtype == torch.bfloat16 else self._library.prefill_fixed_f32
        status = kernel(q.data_ptr(), kv_cache.data_ptr(), plan.tables.data_ptr(), rows.seq.data_ptr(),
                        rows.lens.data_ptr(), q.shape[0], plan.tables.shape[1], q.shape[1], kv_cache.shape[3],
                        q.shape[2], kv_cache.shape[2], scale, out.data_ptr(), torch.get_num_threads())
        _raise_on(status, "prefill_fixed", q, kv_cache)

    def _output(self, q, out, rows: _Rows, plan: _Plan, kv_cache: torch.Tensor, scale: float) -> None:
        kernel = self._library.paged_decode_bf16 if q.dtype == torch.bfloat16 else self._library.paged_decode_f32
        status = kernel(
            q.data_ptr(), None, None, None, kv_cache.data_ptr(), rows.tables.data_ptr(), rows.lens.data_ptr(),
            q.shape[0], rows.tables.shape[1], q.shape[1], kv_cache.shape[3], q.shape[2], kv_cache.shape[2], scale,
            out.data_ptr(), torch.get_num_threads(), 1, None, 0.0, 0,
        )
        _raise_on(status, "paged_decode", q, kv_cache)

    def _check(self, q: torch.Tensor, kv_cache: torch.Tensor, plan: _Plan) -> None:
        shape = (q.shape[1], kv_cache.shape[3], q.shape[2], kv_cache.shape[2])
        fits = (kv_cache.device.type == "cpu" and q.device.type == "cpu" and kv_cache.dtype in NATIVE_DTYPES
                and q.dtype == kv_cache.dtype and kv_cache.is_contiguous() and q.shape[2] == kv_cache.shape[4]
                and q.shape[1] % kv_cache.shape[3] == 0
                and self._library.paged_decode_supports(*shape) and self._library.prefill_fixed_supports(*shape))
        if not fits:
            raise ValueError(f"{self.name} cannot serve q {q.dtype} {list(q.shape)} over a cache "
                             f"{kv_cache.dtype} {list(kv_cache.shape)} (CPU, contiguous bf16/float32 only)")
        if plan.highest_block >= kv_cache.shape[0] or plan.block_size != kv_cache.shape[2]:
            raise ValueError(f"the step uses block {plan.highest_block} of {plan.block_size} slots; "
                             f"the cache is {list(kv_cache.shape)}")


@dataclass
class _Rows:
    """The rows of a step one kernel runs: their indices among the step's rows (None: all of them), the
    sequence each reads (the prompt kernel) or its own table row (the decode kernel), slots attended."""

    index: torch.Tensor | None
    seq: torch.Tensor
    lens: torch.Tensor
    tables: torch.Tensor | None = None

    @staticmethod
    def of(index: list[int], seq: list[int], lens: list[int], num_tokens: int,
           tables: torch.Tensor | None = None) -> _Rows | None:
        if not index:
            return None
        seq_tensor = torch.tensor(seq, dtype=torch.int32)
        return _Rows(None if len(index) == num_tokens else torch.tensor(index), seq_tensor,
                     torch.tensor(lens, dtype=torch.int32),
                     None if tables is None else tables[seq_tensor.long()].contiguous())


@dataclass
class _Plan:
    num_tokens: int
    block_size: int
    rows: torch.Tensor  # K row of each token's slot
    tables: torch.Tensor  # [num_seqs, widest] int32
    highest_block: int
    prompt: _Rows | None
    output: _Rows | None


def _raise_on(status: int, kernel: str, q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    if status != 0:
        raise RuntimeError(f"{kernel} failed with status {status} (q {list(q.shape)}, cache {list(kv_cache.shape)})")
