"""Projections ``x @ W.T``: bf16 weights on CPU pre-packed for oneDNN, optionally 4-bit for few rows.

torch's plain ``F.linear`` on bf16 CPU tensors re-lays the weight out on every call; oneDNN's packed
("blocked") weight layout, the one TorchInductor uses, makes the same products 1.5–2.3× faster here
(measured at 1, 32 and 512 rows on this project's CPU, results bit-identical at 1 and 32 rows). float32
and GPU weights stay plain tensors with ``F.linear`` (float32 is the exact-parity mode).

A weight may also carry its 4-bit form (:mod:`kernels.int4_linear`, from a Q4 GGUF file): products of at
most ``int4_max_rows`` rows (small decode batches, bound by streaming the weight from memory) use it,
larger ones (prefill chunks, large batches, bound by arithmetic) use the dense weight.

Row invariance (the deterministic mode): a row's result must not depend on how many rows share the
product. Measured on this project's CPU (bf16, SmolLM2-135M's shapes, 1 and 2 threads): torch's int4 kernel
gives every row the same bits at any row count (1..1024), while oneDNN's dense kernel does so only up to
32 rows and switches kernel (and reduction order) above — by up to 0.03 in bf16 — and the switch between
the two paths at ``int4_max_rows`` changes a row by up to 0.13. So ``int4_max_rows=INT4_ALL_ROWS`` gives
one 4-bit path for every step, and ``row_block`` runs a dense product in blocks of at most that many rows.

The deterministic mode's cheaper prefill (:class:`RowPaths`): the path is chosen per ROW by the kind of
position it computes, not per step by the row count. A row of a prompt position always runs dense: on a CPU
with AMX through :mod:`kernels.amx_linear` (each output summed in one order at any row count; faster than
oneDNN here at 1, 32 and 512 rows), elsewhere in zero-padded oneDNN products of exactly
:data:`PROMPT_ROW_BLOCK` rows (a product of a fixed shape gives a row the same bits wherever it sits among
the block's rows and whatever the others hold: measured for 32..512-row blocks; 128 rows run a 512-row
prefill near the unblocked speed, 32 took twice as long; the price is a short chunk's padding). A row of an
output position runs 4-bit: through :mod:`kernels.int4_fixed` where it runs (AVX512-BF16/VNNI: one set of
bits at every row count and faster than torch's kernel at 1-32 rows here), else torch's int4 kernel (or,
for a weight without a 4-bit form, dense: on the AMX form where there is one, else in blocks of at most
``row_block`` rows). A mixed step gathers each group, runs it on its path and scatters the results back, so
each row gets the bits it gets alone on its own path, whatever shares its step or where its chunk starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.amx_linear import AmxWeight, amx_linear, pack_amx
from kernels.int4_fixed import Int4FixedWeight, int4_fixed_linear, pack_int4_fixed
from kernels.int4_linear import GroupQuantized, Int4Weight, int4_linear, pack_int4

INT4_ALL_ROWS = 2**62
"""``int4_max_rows`` that sends every product to the 4-bit weight (the deterministic mode)."""
INVARIANT_ROW_BLOCK = 32
"""The most rows per dense product whose per-row result is that of the row alone (measured; the kernel
test ``tests/kernels/test_linear_row_invariant.py`` checks it on the machine it runs on)."""
_NO_DENSE = torch.empty(0)
"""``LinearWeight.weight`` of a weight that keeps no dense form (see :func:`prepare_linear`)."""
PROMPT_ROW_BLOCK = 128
"""Rows of every dense product of prompt rows under :class:`RowPaths` (zero-padded): one fixed shape, so a
row's bits do not depend on its neighbours or its place (checked by the same test)."""


@dataclass(frozen=True)
class LinearWeight:
    """A weight ``[out, in]`` ready for :func:`linear`: the plain tensor or oneDNN's packed form, and
    optionally its 4-bit form for products of at most ``int4_max_rows`` rows."""

    weight: torch.Tensor
    packed: bool
    out_features: int
    int4: Int4Weight | None = None
    int4_max_rows: int = 0
    bias: torch.Tensor | None = None  # added to every row (q/k/v biases of Qwen2)
    row_block: int = 0  # > 0: dense products run in blocks of at most this many rows (row invariance)
    amx: AmxWeight | None = None  # the prompt rows' products where AMX serves them (row invariance)
    int4_fixed: Int4FixedWeight | None = None  # the 4-bit products under row invariance, where it runs

    @property
    def has_int4(self) -> bool:
        return self.int4 is not None or self.int4_fixed is not None


def _packing_supported(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def prepare_linear(weight: torch.Tensor, pack: bool = True, int4: GroupQuantized | None = None,
                   int4_max_rows: int = 0, bias: torch.Tensor | None = None, row_block: int = 0,
                   prompt_rows: bool = False) -> LinearWeight:
    """``int4``: the same weight's 4-bit codes, used for products of at most ``int4_max_rows`` rows (the
    caller checks :func:`kernels.int4_linear.int4_supported`). ``bias``: ``[out]``, in the weight's dtype.
    ``row_block``: see :class:`LinearWeight`. ``prompt_rows`` (a weight the model runs with :class:`RowPaths`,
    or the LM head) and ``row_block``: a bf16 CPU weight is packed for :mod:`kernels.amx_linear` where the CPU
    has AMX (the prompt rows' path). ``int4`` with ``row_block``: the 4-bit codes are packed for
    :mod:`kernels.int4_fixed` where it runs (then not for torch's kernel). A weight with the AMX form runs every
    dense product there (prompt rows, output rows without a 4-bit form, the LM head's rows), so it keeps no
    dense copy."""
    use_int4 = int4 is not None and int4_max_rows > 0
    fixed = pack_int4_fixed(int4, bias) if use_int4 and row_block and weight.dtype == torch.bfloat16 else None
    packed_int4 = pack_int4(int4, weight.dtype) if use_int4 and fixed is None else None
    if use_int4:
        assert tuple(int4.shape) == tuple(weight.shape), (
            f"4-bit weight {int4.shape} differs from the dense one {tuple(weight.shape)}")
    amx = pack_amx(weight, bias) if row_block and prompt_rows else None
    if amx is not None:
        # every row runs on the AMX form (or, output rows of a 4-bit weight, on that): no dense copy is kept
        return LinearWeight(_NO_DENSE, False, weight.shape[0], packed_int4, int4_max_rows, bias, row_block, amx,
                            fixed)
    if pack and _packing_supported(weight):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        return LinearWeight(packed, True, weight.shape[0], packed_int4, int4_max_rows, bias, row_block,
                            int4_fixed=fixed)
    return LinearWeight(weight.contiguous(), False, weight.shape[0], packed_int4, int4_max_rows, bias, row_block,
                        int4_fixed=fixed)


@dataclass(frozen=True)
class RowPaths:
    """Which rows of a step take the dense path and which the 4-bit one (the deterministic mode), built once
    per step by :meth:`of`. ``dense_rows``/``int4_rows``: the row indices of each group, both None when all
    rows are of one kind (``all_dense`` says which); then :func:`linear` gathers nothing."""

    all_dense: bool
    dense_rows: torch.Tensor | None = None
    int4_rows: torch.Tensor | None = None

    @staticmethod
    def of(dense: list[bool], device: torch.device | str = "cpu") -> RowPaths:
        """``dense[i]``: row ``i`` runs dense (a prompt position), else 4-bit (an output position)."""
        num_dense = sum(dense)
        if num_dense in (0, len(dense)):
            return RowPaths(all_dense=num_dense > 0)
        rows = torch.arange(len(dense), device=device)
        mask = torch.tensor(dense, dtype=torch.bool, device=device)
        return RowPaths(False, rows[mask], rows[~mask])

    @property
    def mixed(self) -> bool:
        return self.dense_rows is not None


def linear(x: torch.Tensor, weight: LinearWeight, paths: RowPaths | None = None) -> torch.Tensor:
    """``x [T, in] @ W.T`` → ``[T, out]``.

    ``paths`` None: the 4-bit weight for at most ``int4_max_rows`` rows, else dense: on the AMX form where the
    weight has one, else in blocks of at most ``row_block`` rows. ``paths`` given: prompt rows dense (the AMX
    form, else padded blocks of :data:`PROMPT_ROW_BLOCK`), output rows 4-bit (a weight without a 4-bit form:
    dense, as without ``paths``)."""
    if paths is not None:
        return _by_row_paths(x, weight, paths)
    if weight.has_int4 and x.shape[0] <= weight.int4_max_rows:
        return _int4(x, weight)
    return _dense_blocked(x, weight)


def _by_row_paths(x: torch.Tensor, weight: LinearWeight, paths: RowPaths) -> torch.Tensor:
    output_path = _int4 if weight.has_int4 else _dense_blocked
    if not paths.mixed:
        return _dense_padded(x, weight) if paths.all_dense else output_path(x, weight)
    out = x.new_empty(x.shape[0], weight.out_features)
    out.index_copy_(0, paths.dense_rows, _dense_padded(x.index_select(0, paths.dense_rows), weight))
    out.index_copy_(0, paths.int4_rows, output_path(x.index_select(0, paths.int4_rows), weight))
    return out


def _int4(x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    if weight.int4_fixed is not None:
        return int4_fixed_linear(x, weight.int4_fixed)  # the bias added inside, before the one rounding
    out = int4_linear(x, weight.int4)
    return out if weight.bias is None else out + weight.bias


def _dense_blocked(x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    if weight.amx is not None:  # row-invariant at any row count: no blocks
        return amx_linear(x, weight.amx)
    block = weight.row_block
    if block and x.shape[0] > block:
        return torch.cat([_dense(x[i:i + block], weight) for i in range(0, x.shape[0], block)])
    return _dense(x, weight)


def _dense_padded(x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    """The AMX kernel where it serves the weight (any row count); else products of exactly
    :data:`PROMPT_ROW_BLOCK` rows, a last partial block padded with zero rows."""
    if weight.amx is not None:
        return amx_linear(x, weight.amx)
    rows, block = x.shape[0], PROMPT_ROW_BLOCK
    outs = [_dense(x[i:i + block], weight) for i in range(0, rows - rows % block, block)]
    if rows % block:
        tail = x.new_zeros(block, x.shape[1])
        tail[:rows % block] = x[rows - rows % block:]
        outs.append(_dense(tail, weight)[:rows % block])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _dense(x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    if weight.weight is _NO_DENSE:
        raise RuntimeError("this weight keeps only its AMX and 4-bit forms (the deterministic mode): no dense product")
    if weight.packed:
        return torch.ops.mkldnn._linear_pointwise(x, weight.weight, weight.bias, "none", [], "")
    return F.linear(x, weight.weight, weight.bias)
