"""Gated DeltaNet's token mixing over a batch of sequences that each carry a recurrent state (Qwen3.5's and
Qwen3-Next's linear-attention layers): a depthwise causal convolution and the gated delta rule, pure torch.

A step's rows are the concatenated new tokens of its sequences (``query_lens`` each, in order, as the
paged-attention backends take them); sequence ``b``'s state is row ``slots[b]`` of the state tensors, read as
zeros where ``fresh[b]`` (its first token is among these rows) and written back in place. ``saves`` (:class:`Save`)
copy a sequence's state after one of its rows into another row of the same tensor (a prefix-cache checkpoint).

The delta rule runs in float32, as the released models' kernels do: a sequence of one token by the recurrence
(all such sequences of the step at once), a longer one in chunks of :data:`CHUNK` tokens (the WY form: within a
chunk the rule is a unit-triangular solve and matrix products; across chunks the state carries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

CHUNK = 64


class Save(NamedTuple):
    """After sequence ``seq``'s first ``rows`` new rows (1 to all of them), copy its state into row ``into``."""

    seq: int
    rows: int
    into: int


def saves_of(saves: Sequence[Save], seq: int) -> list[Save]:
    """``seq``'s saves, in row order."""
    return sorted((s for s in saves if s.seq == seq), key=lambda s: s.rows)


def split_single(query_lens: Sequence[int]) -> tuple[list[int], list[int]]:
    """The indices of the one-token sequences, and of the others."""
    single = [b for b, n in enumerate(query_lens) if n == 1]
    return single, [b for b, n in enumerate(query_lens) if n != 1]


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor, slots: Sequence[int],
                  query_lens: Sequence[int], fresh: Sequence[bool], bias: torch.Tensor | None = None,
                  saves: Sequence[Save] = (), silu: bool = True) -> torch.Tensor:
    """SiLU (unless not ``silu``) of each sequence's depthwise causal convolution: ``x [T, C]``, ``weight [C, K]``
    (and ``bias [C]``), ``states [slots, C, K-1]`` (a sequence's last ``K-1`` inputs before these rows, updated in
    place; ``saves`` copy them as they stood after a row). Returns ``[T, C]``."""
    act = F.silu if silu else _identity
    out = torch.empty_like(x)
    width = weight.shape[1] - 1
    starts = sequence_starts(query_lens)
    single, longer = split_single(query_lens)
    if single:
        rows = torch.tensor([starts[b] for b in single])
        with state_rows(states, [slots[b] for b in single], [fresh[b] for b in single]) as past:
            window = torch.cat([past, x[rows].unsqueeze(-1)], dim=-1)  # [n, C, K]
            # one output per channel: K products summed in float32 and rounded once, as conv1d's kernels accumulate
            # (a grouped conv1d costs ~0.15 ms of setup a call here, for microseconds of work)
            conv = (window.float() * weight.float()).sum(-1)
            out[rows] = act((conv if bias is None else conv + bias.float()).to(x.dtype))
            past.copy_(window[..., 1:])
        _save_final(states, slots, single, saves)
    for b in longer:
        seq = x[starts[b]:starts[b] + query_lens[b]].t()  # [C, L]
        past = states[slots[b]].zero_() if fresh[b] else states[slots[b]]
        window = torch.cat([past, seq], dim=-1)  # [C, K-1+L]
        conv = F.conv1d(window.unsqueeze(0), weight.unsqueeze(1), bias, groups=weight.shape[0])[0]  # [C, L]
        out[starts[b]:starts[b] + query_lens[b]] = act(conv).t()
        for save in saves_of(saves, b):  # the K-1 inputs before row `rows`
            states[save.into] = window[:, save.rows:save.rows + width]
        states[slots[b]] = window[:, -width:]
    return out


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     states: torch.Tensor, slots: Sequence[int], query_lens: Sequence[int],
                     fresh: Sequence[bool], saves: Sequence[Save] = ()) -> torch.Tensor:
    """The gated delta rule: ``q, k [T, Hk, dk]`` (l2-normed here; q then scaled by ``dk ** -0.5``), ``v [T, Hv,
    dv]`` (each key head serves ``Hv / Hk`` consecutive value heads), ``g [T, Hv]`` the log decay, ``beta [T, Hv]``
    the write strength; ``states [slots, Hv, dk, dv]`` float32, updated in place (and copied at ``saves``). Returns
    ``[T, Hv, dv]`` in v's dtype."""
    heads = v.shape[1]
    if k.shape[1] != heads:
        q = q.repeat_interleave(heads // k.shape[1], dim=1)
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
    q = _l2norm(q.float()) * q.shape[-1] ** -0.5
    k, values, g, beta = _l2norm(k.float()), v.float(), g.float(), beta.float()
    out = torch.empty_like(values)
    scan_sequences(out, states, slots, query_lens, fresh,
                   lambda rows, state: _recurrent_step(q[rows], k[rows], values[rows], g[rows], beta[rows], state),
                   lambda span, state: _chunked(q[span], k[span], values[span], g[span], beta[span], state), saves)
    return out.to(v.dtype)


Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Chunked = Callable[[slice, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def scan_sequences(out: torch.Tensor, states: torch.Tensor, slots: Sequence[int], query_lens: Sequence[int],
                   fresh: Sequence[bool], step: Step, chunked: Chunked, saves: Sequence[Save] = ()) -> None:
    """Fill ``out``'s rows sequence by sequence from each one's state: the one-token sequences at once through
    ``step(their rows, their states)`` (states updated in place), each longer one through ``chunked(its rows, its
    state) -> (outputs, final state)``, in pieces that end at its ``saves`` (the state after each is copied)."""
    starts = sequence_starts(query_lens)
    single, longer = split_single(query_lens)
    if single:
        rows = torch.tensor([starts[b] for b in single])
        with state_rows(states, [slots[b] for b in single], [fresh[b] for b in single]) as state:
            out[rows] = step(rows, state)
        _save_final(states, slots, single, saves)
    for b in longer:
        state = states[slots[b]].zero_() if fresh[b] else states[slots[b]]
        begin = 0
        for save in saves_of(saves, b):
            if save.rows > begin:
                span = slice(starts[b] + begin, starts[b] + save.rows)
                out[span], state = chunked(span, state)
                begin = save.rows
            states[save.into] = state
        if begin < query_lens[b]:
            span = slice(starts[b] + begin, starts[b] + query_lens[b])
            out[span], state = chunked(span, state)
        states[slots[b]] = state


def _save_final(states: torch.Tensor, slots: Sequence[int], single: list[int], saves: Sequence[Save]) -> None:
    """The saves of one-token sequences: their state after their one row."""
    for save in saves:
        if save.seq in single:
            states[save.into] = states[slots[save.seq]]


@contextlib.contextmanager
def state_rows(states: torch.Tensor, slots: list[int], fresh: list[bool]) -> Iterator[torch.Tensor]:
    """The rows ``slots`` of ``states`` (``fresh`` ones zeroed) to update in place: a view where the slots run
    consecutively (no copy), else a gathered copy written back after."""
    first = slots[0]
    if slots == list(range(first, first + len(slots))):
        rows = states[first:first + len(slots)]
        for i, zero in enumerate(fresh):
            if zero:
                rows[i].zero_()
        yield rows
        return
    index = torch.tensor(slots, device=states.device)
    rows = states.index_select(0, index)
    rows[torch.tensor(fresh, device=states.device)] = 0
    yield rows
    states.index_copy_(0, index, rows)


def sequence_starts(query_lens: Sequence[int]) -> list[int]:
    starts, total = [], 0
    for n in query_lens:
        starts.append(total)
        total += n
    return starts


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor) -> torch.Tensor:
    """One token of ``n`` sequences (``q, k [n, H, dk]``, ``v [n, H, dv]``, ``g, beta [n, H]``); ``state [n, H, dk,
    dv]`` updated in place. Returns ``[n, H, dv]``.

    With ``S' = e^g S + k ⊗ delta``, both of the state's reads come from one product of the old state (``S^T k``
    and ``S^T q``; ``S'^T q = e^g S^T q + (k · q) delta``), and the update is two in-place passes."""
    n, heads, dk, dv = state.shape
    flat = state.view(n * heads, dk, dv)
    # [k q]ᵀ S, read in the state's own order (Sᵀ [k q] walked it across its rows: ~3× slower on a CPU)
    read = torch.bmm(torch.stack([k, q], dim=-2).view(n * heads, 2, dk), flat).view(n, heads, 2, dv).transpose(-1, -2)
    decay = g.exp()[..., None]
    delta = (v - decay * read[..., 0]) * beta[..., None]
    out = decay * read[..., 1] + (k * q).sum(-1, keepdim=True) * delta
    flat.mul_(decay.view(n * heads, 1, 1)).baddbmm_(k.reshape(n * heads, dk, 1), delta.reshape(n * heads, 1, dv))
    return out


def _chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of ``L`` tokens (``q, k [L, H, dk]``, ``v [L, H, dv]``, ``g, beta [L, H]``) from ``state [H, dk,
    dv]``: its outputs ``[L, H, dv]`` and its final state. Padding to whole chunks (k, v, beta and g zero) leaves
    the state as it was."""
    length = q.shape[0]
    pad = -length % CHUNK
    if pad:
        q, k, v, g, beta = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in (q, k, v, g, beta))
    chunks = q.shape[0] // CHUNK
    # [H, chunks, C, ...]
    q, k, v = (t.view(chunks, CHUNK, *t.shape[1:]).permute(2, 0, 1, 3) for t in (q, k, v))
    g, beta = (t.view(chunks, CHUNK, -1).permute(2, 0, 1) for t in (g, beta))
    decay_sum = g.cumsum(-1)  # [H, chunks, C]
    below = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = (decay_sum[..., :, None] - decay_sum[..., None, :]).masked_fill(~below, float("-inf")).exp()
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    strictly = (k_beta @ k.transpose(-1, -2) * decay).masked_fill(below.logical_not().logical_or(
        torch.eye(CHUNK, dtype=torch.bool, device=q.device)), 0.0)
    eye = torch.eye(CHUNK, dtype=q.dtype, device=q.device)
    # the chunk's delta rule without its state: (I + strictly lower part)^-1 applied to the beta-weighted rows
    solve = torch.linalg.solve_triangular(eye + strictly, eye.expand_as(strictly).contiguous(), upper=False,
                                          unitriangular=True)
    values = solve @ v_beta
    key_decay = solve @ (k_beta * decay_sum.exp()[..., None])
    within = (q @ k.transpose(-1, -2) * decay).masked_fill(~below, 0.0)
    out = torch.empty_like(values)
    for c in range(chunks):
        fresh_values = values[:, c] - key_decay[:, c] @ state
        out[:, c] = (q[:, c] * decay_sum[:, c, :, None].exp()) @ state + within[:, c] @ fresh_values
        last = decay_sum[:, c, -1]
        state = state * last.exp()[:, None, None] + \
            (k[:, c] * (last[:, None] - decay_sum[:, c]).exp()[..., None]).transpose(-1, -2) @ fresh_values
    heads, dim = out.shape[0], out.shape[-1]
    return out.permute(1, 2, 0, 3).reshape(chunks * CHUNK, heads, dim)[:length], state
