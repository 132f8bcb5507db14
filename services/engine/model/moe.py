"""The sparse mixture-of-experts MLP of Qwen3-MoE: a router picks each token's top-k experts; each expert
is a SwiGLU MLP. Tokens are grouped by expert (one gather, two GEMMs and one scatter-add per expert that
has tokens), in ascending expert order as transformers adds them, so float32 sums agree."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.linear import LinearWeight, linear
from services.engine.model.config import MoEConfig


@dataclass
class MoEWeights:
    router: LinearWeight  # [num_experts, hidden]
    gate_up: list[LinearWeight]  # per expert [2 * expert_intermediate, hidden]
    down: list[LinearWeight]  # per expert [hidden, expert_intermediate]


def moe_forward(x: torch.Tensor, weights: MoEWeights, config: MoEConfig) -> torch.Tensor:
    """``x [T, hidden]`` → ``[T, hidden]``."""
    router_logits = linear(x, weights.router)
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    top_probs, top_experts = probs.topk(config.top_k, dim=-1)
    if config.norm_topk_prob:
        top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
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
        gate, up = linear(x[tokens], weights.gate_up[expert]).chunk(2, dim=-1)
        y = linear(F.silu(gate) * up, weights.down[expert]) * top_probs[slots, None]
        out.index_add_(0, tokens, y)
    return out
