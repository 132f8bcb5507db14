"""Mamba-1's selective scan over a batch of sequences that each carry a state, pure torch (AI21 Jamba's Mamba layers):
per channel ``d`` and state dim ``n``, ``h_t = exp(dt_t · A) ⊙ h_{t-1} + (dt_t x_t) B_t`` and ``y_t = h_t · C_t``, the
decay differing per channel and state dim (Mamba-2's is one scalar per head: :mod:`kernels.ssd`).

Rows, slots and fresh states as :mod:`kernels.gated_delta` takes them; the states are ``[slots, channels, state_size]``
float32, updated in place. One-token sequences run the recurrence together; longer ones run in chunks of
:data:`CHUNK` tokens (within a chunk, a masked product over ``[CHUNK, CHUNK, channels, state_size]``: the chunk is
short, since that product grows with the channels times the state; across chunks, the state carries).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kernels.gated_delta import Save, scan_sequences

CHUNK = 16


def selective_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   states: torch.Tensor, slots: Sequence[int], query_lens: Sequence[int], fresh: Sequence[bool],
                   saves: Sequence[Save] = ()) -> torch.Tensor:
    """``x, dt [T, D]`` (the step sizes biased and softplus'ed), ``a [D, N]`` (negative), ``b, c [T, N]``. Returns
    ``y [T, D]`` float32 (no ``D`` skip, no gate)."""
    dt = dt.float()
    values, b, c = x.float() * dt, b.float(), c.float()
    a = a.float()
    out = torch.empty_like(values)
    scan_sequences(out, states, slots, query_lens, fresh,
                   lambda rows, state: _recurrent_step(values[rows], dt[rows], a, b[rows], c[rows], state),
                   lambda span, state: _chunked(values[span], dt[span], a, b[span], c[span], state), saves)
    return out


def _recurrent_step(u: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                    state: torch.Tensor) -> torch.Tensor:
    """One token of ``n`` sequences (``u = dt · x`` and ``dt [n, D]``, ``b, c [n, N]``); ``state [n, D, N]`` updated
    in place. Returns ``[n, D]``."""
    state.mul_((dt[..., None] * a).exp()).add_(u[..., None] * b[:, None, :])
    return (state * c[:, None, :]).sum(-1)


def _chunked(u: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: ``u [L, D]`` (x · dt), ``dt [L, D]``, ``b, c [L, N]``, from ``state [D, N]``; its outputs
    ``[L, D]`` and final state. Zero padding (a step size of 0) leaves the state as it was."""
    length = u.shape[0]
    pad = -length % CHUNK
    if pad:
        u, dt, b, c = (F.pad(t, (0, 0, 0, pad)) for t in (u, dt, b, c))
    ones = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=u.device)
    above, on_or_above = ~ones.tril()[..., None, None], ~ones.tril(-1)[..., None, None]
    out = torch.empty_like(u)
    for start in range(0, u.shape[0], CHUNK):
        rows = slice(start, start + CHUNK)
        log_decay = dt[rows, :, None] * a  # [C, D, N]: each row's
        # [t, s]: the log decay from row s to row t, summed over the rows s < r ≤ t (no difference of two running sums,
        # which would lose precision where the decay is large), -inf above the diagonal, then exp, in place
        between = log_decay[:, None].masked_fill(on_or_above, 0.0).cumsum(0).masked_fill_(above, float("-inf")).exp_()
        written = u[rows, :, None] * b[rows, None, :]  # [C, D, N]: what each row writes
        within = torch.einsum("tsdn,sdn,tn->td", between, written, c[rows])
        out[rows] = torch.einsum("tdn,dn,tn->td", log_decay.cumsum(0).exp(), state, c[rows]) + within
        state = state * log_decay.sum(0).exp() + (between[-1] * written).sum(0)  # between[-1]: each row to the last
    return out[:length], state
