"""The description of a sparse mixture-of-experts MLP (:class:`MoEConfig`), part of
:class:`~services.engine.model.config.ModelConfig` (and re-exported there)."""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.errors import ModelLoadError


@dataclass(frozen=True)
class MoEConfig:
    """A sparse mixture-of-experts MLP: each token goes to its ``top_k`` experts by router softmax (the top-k of
    the softmax, or with ``softmax_after_topk`` the softmax of the top-k logits), or with ``sigmoid_routing``
    (GLM-4.5, DeepSeek-V3) by the sigmoid of the router's float32 logits: the experts are chosen by score plus
    a per-expert correction bias (the router's ``e_score_correction_bias``), only among the ``top_groups`` best
    of ``expert_groups`` groups (a group scored by the sum of its best two), and weighted by their scores
    alone; ``routed_scaling`` multiplies the routed experts' weights (after ``norm_topk_prob``).
    ``biased_choice`` (ERNIE 4.5): the softmax of float32 logits with the same correction bias in the choice
    only (sigmoid routing always has it). ``group_limited_softmax`` (DeepSeek-V2): the softmax of float32 logits,
    the top-k chosen among the ``top_groups`` groups of highest best-expert probability (``group_limited_greedy``;
    with one group, plain ``greedy``), no correction bias. ``grouped_softmax`` (Mistral 4): the softmax of float32
    logits, chosen as sigmoid routing chooses (the ``top_groups`` groups of best-two sum) without a bias, weighted
    by the softmax."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    norm_topk_prob: bool  # the top-k probabilities are renormalised to sum to 1
    sparse_layers: tuple[int, ...]  # layers whose MLP is the sparse block; the others are dense
    softmax_after_topk: bool = False  # GPT-OSS: the softmax of the top-k logits (else the top-k of the softmax)
    sigmoid_after_topk: bool = False  # Llama 4: the sigmoid of each top-k logit
    # Llama 4: each expert takes its token times the weight (rounded to the model dtype), its output added as it is
    # (not on the grouped-GEMM path)
    weights_scale_inputs: bool = False
    swiglu_limit: float | None = None  # GPT-OSS's clamped SwiGLU (see services.engine.model.gpt_oss_decoder)
    swiglu_alpha: float = 1.702
    shared_expert_intermediate_size: int | None = None  # a shared expert every token goes through (Qwen2-MoE's,
    shared_expert_gated: bool = True  # gated by a sigmoid; Granite MoE's: not gated, shared_expert_gated False)
    sigmoid_routing: bool = False
    biased_choice: bool = False
    group_limited_softmax: bool = False
    grouped_softmax: bool = False
    expert_groups: int = 1  # n_group
    top_groups: int = 1  # topk_group
    routed_scaling: float = 1.0  # routed_scaling_factor
    norm_epsilon: float = 1e-20  # sigmoid routing: added to the top-k sum it renormalises by (LFM2-MoE's: 1e-6)
    # stacked experts may be stored transposed ([E, hidden, 2·inter], [E, inter, hidden]: Qwen3-VL-MoE's files),
    # read so where the stored shape is that one, as transformers reads them
    stacked_transposed: bool = False
    # stacked experts always stored transposed (Llama 4's: [E, hidden, 2·inter] and [E, inter, hidden]), whatever
    # the shapes (a square one included)
    stacked_input_major: bool = False
    # the experts' float32 weights multiply their outputs before one rounding (Gemma 4's, whose router is its own)
    float32_expert_weights: bool = False
    # the routed experts' outputs, times their float32 weights, summed in float32 and rounded once (Nemotron 3's, as
    # transformers sums them); else each rounded to the model dtype as it is added
    float32_expert_sum: bool = False
    # each expert (and the shared one) an up and a down projection, no gate (Nemotron 3's, squared-ReLU: the decoder
    # passes the activation); else gate and up rows
    gated_experts: bool = True
    # the routed experts work in a latent width: the tokens projected down to it (``fc1_latent_proj``) and their sum
    # back up (``fc2_latent_proj``); the router and the shared expert see the hidden width (Nemotron 3 Super's)
    latent_size: int | None = None
    # Phi-3.5-MoE's sparsemixer (its ``router_jitter_noise``, as inference runs it; top-2): the first expert is the
    # best logit, weighted by the softmax over the logits within ``2·eps`` (relative) of it; the second the best of
    # the rest, weighted by the softmax over the rest within ``2·eps`` of that one
    sparse_mixer_eps: float | None = None
    # sigmoid routing that chooses by the router's logits plus the correction bias (Kolibri-1's), not by the sigmoids
    # plus it; weighted by the sigmoids as ever
    choice_on_logits: bool = False
    # the shared expert's output and the routed experts' sum are averaged, not summed (Cohere 2 MoE's "average")
    shared_expert_average: bool = False
    # an RMSNorm on the sparse block's output, routed and shared experts summed (A.X-K1's ``post_mlp_layernorm``, a
    # layer's weight; the dense layers' stored copy not read)
    output_norm: bool = False
    # sigmoid routing whose checkpoints may lack the correction bias (A.X-K1's): a missing one is none, as
    # transformers starts it at zero
    correction_bias_optional: bool = False

    @property
    def correction_bias(self) -> bool:
        """The router has an ``e_score_correction_bias`` that joins the choice (sigmoid routing, biased choice)."""
        return self.sigmoid_routing or self.biased_choice

    @property
    def float32_router(self) -> bool:
        """The router runs in float32 (sigmoid routing, biased choice, group-limited or grouped softmax)."""
        return self.correction_bias or self.group_limited_softmax or self.grouped_softmax

    @property
    def float32_weights(self) -> bool:
        """Each routed expert's output is multiplied by its float32 weight and rounded once (GLM-4.5's and the
        DeepSeeks' and Gemma 4's experts, as transformers runs them); the other families round the weight to the model
        dtype."""
        return self.sigmoid_routing or self.group_limited_softmax or self.float32_expert_weights

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ModelLoadError(f"num_experts_per_tok {self.top_k} must be in [1, num_experts={self.num_experts}]")
        if self.sparse_mixer_eps is not None and self.top_k != 2:
            raise ModelLoadError(f"the sparsemixer router picks 2 experts, not num_experts_per_tok {self.top_k}")
        if self.expert_groups < 1 or self.num_experts % self.expert_groups:
            raise ModelLoadError(f"n_group {self.expert_groups} must divide num_experts {self.num_experts}")
        per_group = self.num_experts // self.expert_groups
        if self.expert_groups > 1 and per_group < 2:
            raise ModelLoadError(f"n_group {self.expert_groups} leaves fewer than 2 experts per group (a group is "
                                 "scored by its best two)")
        if not 0 < self.top_groups <= self.expert_groups or self.top_k > self.top_groups * per_group:
            raise ModelLoadError(f"topk_group {self.top_groups} must be in [1, n_group={self.expert_groups}] and "
                                 f"hold num_experts_per_tok {self.top_k} experts ({per_group} per group)")
