"""Kimi Delta Attention (KDA: Kimi Linear's and Ling 3's linear-attention layers) over a batch of sequences that
each carry a state, pure torch: Gated DeltaNet's delta rule (:mod:`kernels.gated_delta`) with a decay per key channel
of each head, not one per head. With ``D = diag(exp(g_t))`` over a head's key dims,

    S_t = D S_{t-1} + k_t ⊗ beta_t (v_t - (D S_{t-1})ᵀ k_t),    o_t = S_tᵀ q_t.

Rows, slots, fresh states and saves as :mod:`kernels.gated_delta` takes them; the states are ``[slots, H, dk, dv]``
float32, updated in place. One-token sequences run the recurrence together; longer ones run in chunks of
:data:`CHUNK` tokens (the WY form, as the gated delta rule's: within a chunk a unit-triangular solve, whose products
here weigh each key dim by its own decay, ``[CHUNK, CHUNK, dk]`` per head, so the chunk is short; across chunks, the
state carries).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kernels.gated_delta import Save, scan_sequences

CHUNK = 16


def kimi_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    states: torch.Tensor, slots: Sequence[int], query_lens: Sequence[int], fresh: Sequence[bool],
                    saves: Sequence[Save] = ()) -> torch.Tensor:
    """``q, k [T, H, dk]`` (l2-normed here, as FLA's kernel does: ``x / sqrt(Σx² + 1e-6)``; q then scaled by ``dk **
    -0.5``), ``v [T, H, dv]``, ``g [T, H, dk]`` the log decay of each key dim, ``beta [T, H]`` the write strength;
    ``states [slots, H, dk, dv]`` float32. Returns ``[T, H, dv]`` in v's dtype."""
    q = _l2norm(q.float()) * q.shape[-1] ** -0.5
    k, values, g, beta = _l2norm(k.float()), v.float(), g.float(), beta.float()
    out = torch.empty_like(values)
    scan_sequences(out, states, slots, query_lens, fresh,
                   lambda rows, state: _recurrent_step(q[rows], k[rows], values[rows], g[rows], beta[rows], state),
                   lambda span, state: _chunked(q[span], k[span], values[span], g[span], beta[span], state), saves)
    return out.to(v.dtype)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def _recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor) -> torch.Tensor:
    """One token of ``n`` sequences (``q, k, g [n, H, dk]``, ``v [n, H, dv]``, ``beta [n, H]``); ``state [n, H, dk,
    dv]`` updated in place. Returns ``[n, H, dv]``.

    Both reads of the decayed state come from one product of the old one: ``(D S)ᵀ k = Sᵀ (e^g ⊙ k)``, and ``S'ᵀ q =
    Sᵀ (e^g ⊙ q) + (k · q) delta``."""
    n, heads, dk, dv = state.shape
    decay = g.exp()
    flat = state.view(n * heads, dk, dv)
    read = torch.bmm(torch.stack([decay * k, decay * q], dim=-2).view(n * heads, 2, dk), flat)  # in S's own order
    read = read.view(n, heads, 2, dv).transpose(-1, -2)
    delta = (v - read[..., 0]) * beta[..., None]
    out = read[..., 1] + (k * q).sum(-1, keepdim=True) * delta
    flat.mul_(decay.view(n * heads, dk, 1)).baddbmm_(k.reshape(n * heads, dk, 1), delta.reshape(n * heads, 1, dv))
    return out


def _chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of ``L`` tokens (``q, k, g [L, H, dk]``, ``v [L, H, dv]``, ``beta [L, H]``) from ``state [H, dk,
    dv]``: its outputs ``[L, H, dv]`` and its final state. Padding to whole chunks (k, v, beta and g zero) leaves the
    state as it was."""
    length = q.shape[0]
    pad = -length % CHUNK
    if pad:
        q, k, v, g, beta = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in (q, k, v, g, beta))
    ones = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device)
    below, strictly_below = ones.tril(), ones.tril(-1)
    eye = torch.eye(CHUNK, dtype=q.dtype, device=q.device)
    out = torch.empty_like(v)
    for start in range(0, q.shape[0], CHUNK):
        rows = slice(start, start + CHUNK)
        # [H, C, ...]
        qc, kc, vc, gc = (t[rows].transpose(0, 1) for t in (q, k, v, g))
        bc = beta[rows].t()
        decay_sum = gc.cumsum(1)  # [H, C, dk]
        # [H, t, s, dk]: the decay of each key dim from row s to row t (t >= s; 0 above the diagonal)
        decay = (decay_sum[:, :, None] - decay_sum[:, None]).masked_fill(~below[..., None], float("-inf")).exp()
        k_beta = kc * bc[..., None]
        strictly = torch.einsum("htd,hsd,htsd->hts", k_beta, kc, decay).masked_fill(~strictly_below, 0.0)
        solve = torch.linalg.solve_triangular(eye + strictly, eye.expand_as(strictly).contiguous(), upper=False,
                                              unitriangular=True)
        fresh_values = solve @ (vc * bc[..., None]) - (solve @ (k_beta * decay_sum.exp())) @ state
        within = torch.einsum("htd,hsd,htsd->hts", qc, kc, decay)
        out[rows] = ((qc * decay_sum.exp()) @ state + within @ fresh_values).transpose(0, 1)
        last = decay_sum[:, -1]  # [H, dk]
        state = state * last.exp()[..., None] + \
            (kc * (last[:, None] - decay_sum).exp()).transpose(-1, -2) @ fresh_values
    return out[:length], state
