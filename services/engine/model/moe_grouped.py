"""The experts of a sparse MLP as two grouped GEMMs, with no host sync (the GPU path; issue 29).

:func:`moe.moe_forward`'s loop reads each expert's token count back to the host to slice its tokens: one
device sync per sparse layer, which a CUDA graph cannot hold. Here the experts' weights are stacked
(``gate_up [E, 2I, H]``, ``down [E, H, I]``), the step's (token, expert) slots are sorted by expert on the
device, and ``torch.nn.functional.grouped_mm`` runs every expert's rows in one call per projection, its
group boundaries read on the device. So a sparse layer launches a fixed set of kernels whatever the
routing, and a decode step of a MoE model can be captured.

The numbers are the loop's: each token's experts are added in ascending expert order, one rounding per add
in the model's dtype, as ``index_add_`` does expert after expert (and as transformers adds them); each
group's product is a plain product of its rows (on a CPU ``grouped_mm`` gives ``F.linear``'s bits, checked
by ``tests/engine/test_moe_grouped.py``; on a GPU its kernel differs from the loop's in the last bits).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from kernels.fused_ops import SiluAndMul, torch_silu_and_mul


@dataclass(frozen=True)
class GroupedExperts:
    """Every expert's weights of one sparse layer, stacked in Hugging Face's per-expert layout."""

    gate_up: torch.Tensor  # [num_experts, 2 * expert_intermediate, hidden]
    down: torch.Tensor  # [num_experts, hidden, expert_intermediate]


def grouped_experts_forward(x: torch.Tensor, experts: GroupedExperts, top_probs: torch.Tensor,
                            top_experts: torch.Tensor,
                            silu_and_mul: SiluAndMul) -> torch.Tensor:
    """``x [T, hidden]`` through each token's ``top_experts [T, k]`` weighted by ``top_probs [T, k]`` → ``[T, hidden]``:
    the weighted outputs summed in ``top_probs``' dtype (``x.dtype``, or float32 for a float32 sum), rounded to
    ``x.dtype`` at the end."""
    num_tokens, top_k = top_experts.shape
    top_experts, ascending = top_experts.sort(dim=-1)  # a token's experts are added in ascending order
    top_probs = top_probs.gather(1, ascending)
    slots = top_experts.flatten()
    order = slots.argsort(stable=True)  # the slots grouped by expert
    counts = torch.zeros(experts.gate_up.shape[0], dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, slots, torch.ones_like(slots, dtype=torch.int32))  # bincount would sync on CUDA
    offsets = counts.cumsum(0, dtype=torch.int32)
    hidden = F.grouped_mm(x.index_select(0, order // top_k), experts.gate_up.transpose(1, 2), offs=offsets)
    y = F.grouped_mm(silu_and_mul(hidden), experts.down.transpose(1, 2), offs=offsets)
    y = y * top_probs.flatten().index_select(0, order).unsqueeze(1)
    by_token = torch.empty_like(y).index_copy_(0, order, y).view(num_tokens, top_k, -1)
    out = torch.zeros_like(by_token[:, 0])
    for slot in range(top_k):
        out += by_token[:, slot]
    return out.to(x.dtype)


@cache
def grouped_experts_problem(device: torch.device, dtype: torch.dtype) -> str:
    """Why :func:`grouped_experts_forward` cannot serve ``dtype`` on ``device`` ("" when it can): a small
    routing run once against the per-expert products. On CUDA it must also run without a host sync:
    ``grouped_mm``'s grouped kernel serves bf16 on compute capability 9-10 (torch 2.13); elsewhere torch falls
    back to one product per group after reading the offsets back to the host, which gives the right numbers
    but no capturable step, so that counts as a failure here (the per-expert loop is then as good)."""
    generator = torch.Generator().manual_seed(0)
    num_experts, hidden, inter, tokens, top_k = 4, 64, 32, 6, 2

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) / 4).to(device=device, dtype=dtype)

    experts = GroupedExperts(rand(num_experts, 2 * inter, hidden), rand(num_experts, hidden, inter))
    x = rand(tokens, hidden)
    top_experts = torch.tensor([[0, 1], [1, 0], [3, 1], [1, 3], [0, 3], [3, 0]], device=device)
    top_probs = torch.full((tokens, top_k), 0.5, dtype=dtype, device=device)

    try:
        with _no_host_sync(device):
            got = grouped_experts_forward(x, experts, top_probs, top_experts, torch_silu_and_mul)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        return f"grouped_mm failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    want = torch.zeros_like(x)
    for token in range(tokens):
        for expert in sorted(top_experts[token].tolist()):
            h = F.linear(x[token:token + 1], experts.gate_up[expert])
            want[token] += (F.linear(torch_silu_and_mul(h), experts.down[expert]) * 0.5)[0]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    error = (got.float() - want.float()).abs().max().item()
    return "" if error <= tolerance else f"grouped_mm disagrees with the per-expert products by {error:.3g}"


@contextmanager
def _no_host_sync(device: torch.device) -> Iterator[None]:
    """On CUDA, a synchronizing call inside raises (``torch.cuda.set_sync_debug_mode``)."""
    if device.type != "cuda":
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)
