"""The sparse mixture-of-experts MLP of Qwen3-MoE, Mixtral, GPT-OSS, Granite MoE, GLM-4.5, ERNIE 4.5, the DeepSeeks
and Nemotron 3: a router picks each token's top-k experts (:func:`route`); each expert is a gated MLP (SwiGLU;
GPT-OSS passes its clamped one as ``silu_and_mul``, and its experts and router have biases, held by their
:class:`LinearWeight`), or Nemotron 3's ungated one (up, squared ReLU, down; ``MoEConfig.gated_experts``). Tokens
are grouped by expert (one gather, two GEMMs and one scatter-add per expert that has tokens), in ascending expert
order as transformers adds them, so float32 sums agree. With ``MoEWeights.grouped`` (the GPU path) the same
numbers come from two grouped GEMMs and no host read (:mod:`moe_grouped`)."""

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
    Granite MoE's and GLM-4.5's have no gate (``None``: weight 1)."""

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
    # sigmoid routing, biased choice: the router is float32 and this [num_experts] float32 bias joins the scores
    # that choose (not the weights)
    choice_bias: torch.Tensor | None = None
    # MoEConfig.latent_size: the tokens' projection to the experts' width [latent, hidden], and their sum's back
    latent_in: LinearWeight | None = None
    latent_out: LinearWeight | None = None


def route(x: torch.Tensor, weights: MoEWeights, config: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts ``[T, top_k]`` and their float32 weights (see :class:`MoEConfig`)."""
    if config.sigmoid_routing or config.grouped_softmax:
        return _grouped_route(x, weights, config)
    if config.biased_choice:
        return _biased_softmax_route(x, weights, config)
    if config.group_limited_softmax:
        return _group_limited_softmax_route(x, weights, config)
    router_logits = linear(x, weights.router)
    if config.sparse_mixer_eps is not None:
        return sparse_mixer_route(router_logits, config.sparse_mixer_eps)
    if config.softmax_after_topk or config.sigmoid_after_topk:
        top_logits, top_experts = router_logits.topk(config.top_k, dim=-1)
        top_probs = torch.sigmoid(top_logits.float()) if config.sigmoid_after_topk \
            else torch.softmax(top_logits, dim=-1, dtype=torch.float32)
    else:
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        top_probs, top_experts = probs.topk(config.top_k, dim=-1)
    if config.norm_topk_prob:
        top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
    return top_probs, top_experts


def sparse_mixer_route(logits: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3.5-MoE's sparsemixer as inference runs it (``MoEConfig.sparse_mixer_eps``): two experts, each the best
    logit of those left, weighted by the softmax over the logits left within ``2·eps`` of it (relative to
    ``max(|logit|, best)``), in the logits' dtype as transformers computes it."""
    top_probs, top_experts, left = [], [], logits
    for _ in range(2):
        best, expert = left.max(dim=-1, keepdim=True)
        far = (best - logits) / logits.abs().clamp(min=best) > 2 * eps
        gates = torch.softmax(left.masked_fill(far, float("-inf")), dim=-1)
        top_probs.append(gates.gather(-1, expert))
        top_experts.append(expert)
        left = left.scatter(-1, expert, float("-inf"))
    return torch.cat(top_probs, dim=-1).float(), torch.cat(top_experts, dim=-1)


def _grouped_route(x: torch.Tensor, weights: MoEWeights, config: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM-4.5's and DeepSeek-V3's routing, in float32: chosen by ``sigmoid + bias`` within the best groups,
    weighted by the sigmoid; Mistral 4's (``grouped_softmax``) the same with the softmax and no bias."""
    logits = linear(x.float(), weights.router)
    scores = torch.softmax(logits, dim=-1) if config.grouped_softmax else torch.sigmoid(logits)
    chosen_by = logits if config.choice_on_logits else scores  # (Kolibri-1's: the logits)
    choice = chosen_by if weights.choice_bias is None else chosen_by + weights.choice_bias
    if config.top_groups < config.expert_groups:
        by_group = choice.view(choice.shape[0], config.expert_groups, -1)
        best_groups = by_group.topk(2, dim=-1).values.sum(dim=-1).topk(config.top_groups, dim=-1).indices
        kept = torch.zeros_like(by_group[..., 0], dtype=torch.bool).scatter_(1, best_groups, True)
        choice = by_group.masked_fill(~kept[..., None], float("-inf")).view_as(choice)
    top_experts = choice.topk(config.top_k, dim=-1).indices
    top_probs = scores.gather(1, top_experts)
    if config.norm_topk_prob:
        top_probs = top_probs / (top_probs.sum(dim=-1, keepdim=True) + config.norm_epsilon)
    return top_probs * config.routed_scaling, top_experts


def _biased_softmax_route(x: torch.Tensor, weights: MoEWeights, config: MoEConfig
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """ERNIE 4.5's routing, in float32: chosen by ``softmax + bias``, weighted by the softmax."""
    probs = torch.softmax(linear(x.float(), weights.router), dim=-1)
    choice = probs if weights.choice_bias is None else probs + weights.choice_bias
    top_experts = choice.topk(config.top_k, dim=-1).indices
    top_probs = probs.gather(1, top_experts)
    if config.norm_topk_prob:
        top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True).clamp(min=1e-12)  # ERNIE's moe_norm_min
    return top_probs, top_experts


def _group_limited_softmax_route(x: torch.Tensor, weights: MoEWeights, config: MoEConfig
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's routing, in float32: the top-k of the softmax among the groups whose best expert ranks in the
    ``top_groups`` (``group_limited_greedy``; all experts with one group, ``greedy``)."""
    probs = torch.softmax(linear(x.float(), weights.router), dim=-1)
    choice = probs
    if config.top_groups < config.expert_groups:
        by_group = probs.view(probs.shape[0], config.expert_groups, -1)
        best_groups = by_group.amax(dim=-1).topk(config.top_groups, dim=-1).indices
        kept = torch.zeros_like(by_group[..., 0], dtype=torch.bool).scatter_(1, best_groups, True)
        choice = by_group.masked_fill(~kept[..., None], 0.0).view_as(probs)
    top_probs, top_experts = choice.topk(config.top_k, dim=-1)
    if config.norm_topk_prob:
        top_probs = top_probs / (top_probs.sum(dim=-1, keepdim=True) + 1e-20)
    return top_probs * config.routed_scaling, top_experts


def moe_forward(x: torch.Tensor, weights: MoEWeights, config: MoEConfig,
                silu_and_mul: SiluAndMul = torch_silu_and_mul) -> torch.Tensor:
    """``x [T, hidden]`` → ``[T, hidden]`` (``silu_and_mul``: the model's, see :mod:`kernels.fused_ops`; an ungated
    family's passes its activation of the up rows alone). Routed on ``x``; with latent projections the experts take
    ``x`` projected down and their sum is projected back up."""
    top_probs, top_experts = route(x, weights, config)
    if weights.latent_in is not None and weights.latent_out is not None:
        routed = experts_forward(linear(x, weights.latent_in), weights, config, top_probs, top_experts, silu_and_mul)
        out = linear(routed, weights.latent_out)
    else:
        out = experts_forward(x, weights, config, top_probs, top_experts, silu_and_mul)
    if weights.shared is not None:
        shared = weights.shared
        shared_out = linear(silu_and_mul(linear(x, shared.gate_up)), shared.down)
        if config.shared_expert_average:  # Cohere 2 MoE's
            return (out + shared_out) / 2
        out = out + (shared_out if shared.gate is None else torch.sigmoid(linear(x, shared.gate)) * shared_out)
    return out


def experts_forward(x: torch.Tensor, weights: MoEWeights, config: MoEConfig, top_probs: torch.Tensor,
                    top_experts: torch.Tensor, silu_and_mul: SiluAndMul = torch_silu_and_mul) -> torch.Tensor:
    """The routed experts' sum ``[T, hidden]`` for tokens ``x [T, hidden]`` routed to ``top_experts [T, top_k]`` with
    float32 weights ``top_probs`` (a family with a router of its own calls it; ``silu_and_mul``: the experts'
    activation of their gate times their up rows)."""
    if weights.grouped is not None:
        assert not config.weights_scale_inputs, "grouped experts weight their outputs"
        probs = top_probs.float() if config.float32_expert_sum else top_probs.to(x.dtype)
        return grouped_experts_forward(x, weights.grouped, probs, top_experts, silu_and_mul)
    return _experts_loop(x, weights, config, top_probs, top_experts, silu_and_mul)


def _experts_loop(x: torch.Tensor, weights: MoEWeights, config: MoEConfig, top_probs: torch.Tensor,
                  top_experts: torch.Tensor, silu_and_mul: SiluAndMul) -> torch.Tensor:
    # GLM-4.5's and the DeepSeeks': each expert's output times its float32 weight, rounded once, as transformers
    # does; the other families' weights are rounded to the model dtype first, as theirs are; Nemotron 3's summed in
    # float32 and rounded once at the end
    wide = config.float32_weights or config.float32_expert_sum
    top_probs = top_probs.to(torch.float32 if wide else x.dtype).flatten()
    flat_experts = top_experts.flatten()
    order = flat_experts.argsort(stable=True)
    counts = torch.bincount(flat_experts, minlength=config.num_experts).tolist()
    out = torch.zeros_like(x, dtype=torch.float32 if config.float32_expert_sum else x.dtype)
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        slots = order[start:start + count]
        start += count
        tokens = slots // config.top_k
        if config.weights_scale_inputs:  # Llama 4's: the weight scales what the expert takes
            y = linear(silu_and_mul(linear(x[tokens] * top_probs[slots, None], weights.gate_up[expert])),
                       weights.down[expert])
        else:
            y = linear(silu_and_mul(linear(x[tokens], weights.gate_up[expert])), weights.down[expert])
            y = y * top_probs[slots, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out.to(x.dtype)
