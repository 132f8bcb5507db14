"""The sparse mixture-of-experts MLP of Qwen3-MoE, Mixtral and GPT-OSS: a router picks each token's top-k
experts; each expert is a gated MLP (SwiGLU; GPT-OSS passes its clamped one as ``silu_and_mul``, and its
experts and router have biases, held by their :class:`LinearWeight`). Tokens are grouped by expert (one
gather, two GEMMs and one scatter-add per expert that has tokens), in ascending expert order as transformers
adds them, so float32 sums agree. With
``MoEWeights.grouped`` (the GPU path) the same numbers come from two grouped GEMMs and no host read
(:mod:`moe_grouped`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.fused_ops import SiluAndMul, torch_silu_and_mul
from kernels.linear import LinearWeight, linear
from services.engine.model.config import MoEConfig
from services.engine.model.moe_grouped import GroupedExperts, grouped_experts_forward


@dataclass
class SharedExpert:
    """Qwen2-MoE's shared expert: a SwiGLU MLP every token goes through, scaled by ``sigmoid(gate · x)``;
    Granite MoE's has no gate (``None``: weight 1)."""

    gate_up: LinearWeight  # [2 * shared_intermediate, hidden]
    down: LinearWeight  # [hidden, shared_intermediate]
    gate: LinearWeight | None  # [1, hidden]


@dataclass
class MoEWeights:
    """``grouped``: every expert stacked, run as grouped GEMMs (:mod:`moe_grouped`, the GPU path); then the
    per-expert lists are empty."""

    router: LinearWeight  # [num_experts, hidden]
    gate_up: list[LinearWeight]  # per expert [2 * expert_intermediate, hidden]
    down: list[LinearWeight]  # per expert [hidden, expert_intermediate]
    grouped: GroupedExperts | None = None
    shared: SharedExpert | None = None


def moe_forward(x: torch.Tensor, weights: MoEWeights, config: MoEConfig,
                silu_and_mul: SiluAndMul = torch_silu_and_mul) -> torch.Tensor:
    """``x [T, hidden]`` → ``[T, hidden]`` (``silu_and_mul``: the model's, see :mod:`kernels.fused_ops`)."""
    router_logits = linear(x, weights.router)
    if config.softmax_after_topk:
        top_logits, top_experts = router_logits.topk(config.top_k, dim=-1)
        top_probs = torch.softmax(top_logits, dim=-1, dtype=torch.float32)
    else:
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        top_probs, top_experts = probs.topk(config.top_k, dim=-1)
    if config.norm_topk_prob:
        top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
    if weights.grouped is not None:
        out = grouped_experts_forward(x, weights.grouped, top_probs.to(x.dtype), top_experts, silu_and_mul)
    else:
        out = _experts_loop(x, weights, config, top_probs, top_experts, silu_and_mul)
    if weights.shared is not None:
        shared = weights.shared
        shared_out = linear(silu_and_mul(linear(x, shared.gate_up)), shared.down)
        out = out + (shared_out if shared.gate is None else torch.sigmoid(linear(x, shared.gate)) * shared_out)
    return out


def _experts_loop(x: torch.Tensor, weights: MoEWeights, config: MoEConfig, top_probs: torch.Tensor,
                  top_experts: torch.Tensor, silu_and_mul: SiluAndMul) -> torch.Tensor:
    top_probs = top_probs.to(x.dtype).flatten()
    flat_experts = top_experts.flatten()
    order = flat_experts.argsort(stable=True)
    counts = torch.bincount(flat_experts, minlength=config.num_experts).tolist()
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        slots = order[start:start + count]
        start += count
        tokens = slots // config.top_k
        y = linear(silu_and_mul(linear(x[tokens], weights.gate_up[expert])), weights.down[expert])
        y = y * top_probs[slots, None]
        out.index_add_(0, tokens, y)
    return out
