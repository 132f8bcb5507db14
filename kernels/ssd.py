"""Mamba-2's selective state space (SSD) over a batch of sequences that each carry a state, pure torch (IBM Granite
4.0's ``-H`` layers): per head, ``S_t = exp(dt_t · A) S_{t-1} + B_t ⊗ (dt_t x_t)`` and ``y_t = C_t · S_t``.

Rows, slots and fresh states as :mod:`kernels.gated_delta` takes them; the states are ``[slots, heads, state_size,
head_dim]`` float32, updated in place. One-token sequences run the recurrence together; longer ones run in chunks of
:data:`CHUNK` tokens (within a chunk, a masked product like attention's; across chunks, the state carries).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kernels.gated_delta import Save, scan_sequences

CHUNK = 64


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
             states: torch.Tensor, slots: Sequence[int], query_lens: Sequence[int], fresh: Sequence[bool],
             saves: Sequence[Save] = ()) -> torch.Tensor:
    """``x [T, H, P]``, ``dt [T, H]`` (the step sizes, biased and softplus'ed), ``a [H]`` (negative), ``b, c [T, G,
    N]`` (each of ``G`` groups serves ``H / G`` consecutive heads). Returns ``y [T, H, P]`` float32 (no ``D`` skip)."""
    heads = x.shape[1]
    b = b.float().repeat_interleave(heads // b.shape[1], dim=1)
    c = c.float().repeat_interleave(heads // c.shape[1], dim=1)
    dt = dt.float()
    values, decay = x.float() * dt[..., None], dt * a.float()
    out = torch.empty_like(values)
    scan_sequences(out, states, slots, query_lens, fresh,
                   lambda rows, state: _recurrent_step(values[rows], decay[rows], b[rows], c[rows], state),
                   lambda span, state: _chunked(values[span], decay[span], b[span], c[span], state), saves)
    return out


def _recurrent_step(v: torch.Tensor, g: torch.Tensor, k: torch.Tensor, q: torch.Tensor, state: torch.Tensor
                    ) -> torch.Tensor:
    """One token of ``n`` sequences (``v [n, H, P]``, ``g [n, H]``, ``k, q [n, H, N]``); ``state [n, H, N, P]``
    updated in place (``S' = e^g S + k ⊗ v``, ``y = S'^T q = e^g S^T q + (k · q) v``: one read, two in-place
    passes). Returns ``[n, H, P]``."""
    n, heads, size, dim = state.shape
    flat = state.view(n * heads, size, dim)
    decay = g.exp()[..., None]
    read = torch.bmm(q.reshape(n * heads, 1, size), flat).view(n, heads, dim)  # q^T S: S read in its own order
    out = decay * read + (k * q).sum(-1, keepdim=True) * v
    flat.mul_(decay.view(n * heads, 1, 1)).baddbmm_(k.reshape(n * heads, size, 1), v.reshape(n * heads, 1, dim))
    return out


def _chunked(v: torch.Tensor, g: torch.Tensor, k: torch.Tensor, q: torch.Tensor, state: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: ``v [L, H, P]`` (x · dt), ``g [L, H]`` (log decay), ``k [L, H, N]`` (B), ``q [L, H, N]`` (C),
    from ``state [H, N, P]``; its outputs ``[L, H, P]`` and final state. Zero padding leaves the state as it was."""
    length = v.shape[0]
    pad = -length % CHUNK
    if pad:
        v, g, k, q = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in (v, g, k, q))
    chunks = v.shape[0] // CHUNK
    v, k, q = (t.view(chunks, CHUNK, *t.shape[1:]).permute(2, 0, 1, 3) for t in (v, k, q))  # [H, chunks, C, ...]
    decay_sum = g.view(chunks, CHUNK, -1).permute(2, 0, 1).cumsum(-1)  # [H, chunks, C]
    below = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=v.device).tril()
    decay = (decay_sum[..., :, None] - decay_sum[..., None, :]).masked_fill(~below, float("-inf")).exp()
    within = q @ k.transpose(-1, -2) * decay
    out = torch.empty_like(v)
    for i in range(chunks):
        out[:, i] = (q[:, i] * decay_sum[:, i, :, None].exp()) @ state + within[:, i] @ v[:, i]
        last = decay_sum[:, i, -1]
        state = state * last.exp()[:, None, None] + \
            (k[:, i] * (last[:, None] - decay_sum[:, i]).exp()[..., None]).transpose(-1, -2) @ v[:, i]
    heads, dim = out.shape[0], out.shape[-1]
    return out.permute(1, 2, 0, 3).reshape(chunks * CHUNK, heads, dim)[:length], state
