"""A router of pdserve's (:func:`services.engine.model.moe.route`) held to a transformers router module on the same
random weight and tokens: the same experts for each token, with the same weights."""

from __future__ import annotations

import torch

from kernels.linear import prepare_linear
from services.engine.model.config import MoEConfig
from services.engine.model.moe import MoEWeights, route


def assert_routes_as(hf_router, config: MoEConfig, seed: int, hidden: int = 32, tokens: int = 200) -> torch.Tensor:
    """Draws ``hf_router``'s weight and ``tokens`` inputs, asserts :func:`route` under ``config`` picks its experts with
    its weights (in any order), and returns the tokens (for a second routing under another config)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        hf_router.weight.copy_(torch.randn(config.num_experts, hidden, generator=gen))
    x = torch.randn(tokens, hidden, generator=gen)
    _, hf_weights, hf_experts = hf_router(x)
    weights, experts = route(x, router_weights(hf_router), config)
    order, hf_order = experts.argsort(dim=-1), hf_experts.argsort(dim=-1)
    assert torch.equal(experts.gather(1, order), hf_experts.gather(1, hf_order))
    assert torch.allclose(weights.gather(1, order), hf_weights.gather(1, hf_order), rtol=1e-6, atol=0)
    return x


def router_weights(hf_router) -> MoEWeights:
    """The router's weight as pdserve's MoE weights hold it (no experts)."""
    return MoEWeights(prepare_linear(hf_router.weight.detach().clone(), pack=False), [], [])
