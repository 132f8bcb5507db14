"""The tiny twins of the hybrid families (a recurrent state beside the KV: Mamba-2, gated short convolutions, Gated
DeltaNet, Kimi Delta Attention), part of :data:`tests.engine.tiny_families.FAMILIES` (shapes from its ``SHAPE``)."""

from __future__ import annotations

_HYBRID = dict(head_dim=16, layer_types=["linear_attention", "full_attention", "linear_attention"],
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
               linear_conv_kernel_dim=4, tie_word_embeddings=False)
_GRANITE_HYBRID = dict(layer_types=["mamba", "attention", "mamba"], mamba_n_heads=8, mamba_d_state=16,
                       mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2, shared_intermediate_size=64,
                       embedding_multiplier=12.0, attention_multiplier=0.1, residual_multiplier=0.5,
                       logits_scaling=2.0, tie_word_embeddings=True)

HYBRID_FAMILIES: dict[str, dict] = {
    # Granite 4.0-H: Mamba-2 layers (8 heads of 16, 2 groups, a state of 16) around an attention layer without rope
    # (position_embedding_type nope, as released), Granite's four scalars, experts beside a shared MLP; norms, the
    # conv's bias and dt_bias drawn at random
    "granite_hybrid": dict(model_type="granitemoehybrid", **_GRANITE_HYBRID, num_local_experts=4,
                           num_experts_per_tok=2, intermediate_size=48, position_embedding_type="nope"),
    # granite-4.0-h-micro's kind: the shared MLP alone (no experts), and here rope on the attention layer
    "granite_hybrid-dense": dict(model_type="granitemoehybrid", **_GRANITE_HYBRID, num_local_experts=0,
                                 position_embedding_type="rope", rope_theta=10000.0),
    # granite-4.0-micro's kind: the same checkpoint type with attention on every layer (no recurrent state)
    "granite_hybrid-attention": dict(model_type="granitemoehybrid", **_GRANITE_HYBRID | {
        "layer_types": ["attention"] * 3}, num_local_experts=0, position_embedding_type="rope", rope_theta=10000.0),
    # Bamba: Granite 4.0-H's Mamba-2 layers (8 heads of 16, 2 groups) around an attention layer that rotates half of
    # each head, a dense SwiGLU MLP, no scalars; norms, the conv's bias and dt_bias drawn at random
    "bamba": dict(model_type="bamba", attn_layer_indices=[1], mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2,
                  mamba_d_conv=4, mamba_expand=2, tie_word_embeddings=False),
    # Falcon-H1: a Mamba-2 mixer (8 heads of 8: mamba_d_ssm 64, 2 groups) beside the attention (heads of 32, wider
    # than hidden / heads) of every layer, every muP multiplier away from 1, the mixer's grouped norm before the gate
    # (transformers' default; the GGUF test holds the larger releases' norm after it to transformers); norms, the
    # conv's bias and dt_bias drawn
    "falcon_h1": dict(model_type="falcon_h1", head_dim=32, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=16,
                      mamba_n_groups=2, mamba_d_conv=4, mamba_rms_norm=True, mamba_norm_before_gate=True,
                      embedding_multiplier=1.5, lm_head_multiplier=0.7, key_multiplier=0.8,
                      attention_in_multiplier=1.2, attention_out_multiplier=0.9, ssm_in_multiplier=1.1,
                      ssm_out_multiplier=0.6, ssm_multipliers=[0.5, 1.3, 0.8, 1.2, 0.7], mlp_multipliers=[1.4, 0.6],
                      rope_theta=100000.0, tie_word_embeddings=False),
    # Falcon-H1 without the mixer's norm (its output gated by silu(z) alone), as some releases (0.5B) have it
    "falcon_h1-no_norm": dict(model_type="falcon_h1", head_dim=16, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=16,
                              mamba_n_groups=2, mamba_d_conv=4, mamba_rms_norm=False,
                              ssm_multipliers=[0.5, 1.3, 0.8, 1.2, 0.7], tie_word_embeddings=True),
    # Jamba: Mamba-1 layers (an inner width of 128, a state of 16, step sizes through rank 4) around an attention
    # layer without rope (period 3, offset 1), experts (softmax top-2 of 4, not renormalised) on every other layer;
    # norms (the mixers' inner ones too), the conv's bias and dt_proj's drawn at random
    "jamba": dict(model_type="jamba", attn_layer_period=3, attn_layer_offset=1, num_hidden_layers=4,
                  expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2,
                  mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, tie_word_embeddings=False),
    # Nemotron-H: blocks of one mixer each (Mamba-2 with 8 heads of 16 in 2 groups, a squared-ReLU MLP, attention
    # without rope), as its hybrid_override_pattern "M-*-M" says; norms, the conv's bias and dt_bias drawn at random
    "nemotron_h": dict(model_type="nemotron_h", layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba"],
                       head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
                       conv_kernel=4, time_step_min=0.001, tie_word_embeddings=False),
    # Nemotron 3 Nano: Mamba-2 and expert blocks around an attention one; ungated squared-ReLU experts chosen by sigmoid
    # + correction bias (drawn) within the best of 2 groups, renormalised and scaled, beside a shared MLP; written in
    # NVIDIA's layout (backbone.*, one tensor per expert), as transformers saves it
    "nemotron_h-moe": dict(model_type="nemotron_h", layers_block_type=["mamba", "moe", "attention", "moe"],
                           head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
                           conv_kernel=4, time_step_min=0.001, n_routed_experts=8, num_experts_per_tok=2,
                           moe_intermediate_size=48, moe_shared_expert_intermediate_size=64, n_group=2, topk_group=1,
                           routed_scaling_factor=2.5, tie_word_embeddings=False),
    # LFM2: gated short convolutions (3 taps, their last 2 inputs a recurrent state, no KV) around a Qwen3-style
    # attention layer; the MLP width derived as transformers does (two thirds of 128, rounded up to 32: 96); norms
    # drawn at random
    "lfm2": dict(model_type="lfm2", layer_types=["conv", "full_attention", "conv"], conv_L_cache=3, norm_eps=1e-5,
                 block_multiple_of=32, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                 tie_word_embeddings=True),
    # LFM3: a convolution, a full layer (proportional rope on half of each 16-wide head) and a sliding one (a window of
    # 24, so the prompts cross it; its own plain rope), sandwich norms and a sigmoid gate per attention head (four
    # layers: each kind, and a convolution after the sliding layer)
    "lfm2-lfm3": dict(model_type="lfm3", num_hidden_layers=4, head_dim=16, sliding_window=24, conv_L_cache=3,
                      layer_types=["conv", "full_attention", "sliding_attention", "conv"], tie_word_embeddings=True,
                      pad_token_id=0),  # (its default is past the tiny vocabulary)
    # LFM2-MoE: LFM2's layers with a dense MLP first, then experts chosen by sigmoid + expert_bias (drawn at random),
    # renormalised and scaled
    "lfm2-moe": dict(model_type="lfm2_moe", layer_types=["conv", "full_attention", "conv"], conv_L_cache=3,
                     norm_eps=1e-5, num_dense_layers=1, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                     routed_scaling_factor=2.5, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                     tie_word_embeddings=True),
    # Qwen3.5: Gated DeltaNet layers (a recurrent state, no KV) around a full-attention one with an output gate,
    # rope on half of each head; more value heads than key heads, as released; norms drawn at random (they scale
    # by 1 + weight, initialised to 0)
    "qwen3_5": dict(model_type="qwen3_5_text", **_HYBRID),
    # Qwen3.5-MoE: the same layers, experts with a gated shared expert on every layer
    "qwen3_5-moe": dict(model_type="qwen3_5_moe_text", **_HYBRID, num_experts=8, num_experts_per_tok=2,
                        moe_intermediate_size=48, shared_expert_intermediate_size=64),
    # Qwen3-Next: its DeltaNet projections fused per key head; dense MLP on its middle layer (mlp_only_layers)
    "qwen3_next": dict(model_type="qwen3_next", **_HYBRID, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=48, shared_expert_intermediate_size=64, mlp_only_layers=[1],
                       norm_topk_prob=True),
    # OLMo Hybrid: Gated DeltaNet layers (2 key heads of 16, 4 value heads of 8, the write strength doubled) in Llama's
    # pre-norm layer around OLMo 3's post-norm attention layer without rope (as released); norms and dt_bias drawn
    "olmo_hybrid": dict(model_type="olmo_hybrid", layer_types=["linear_attention", "full_attention",
                                                               "linear_attention"],
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                        linear_value_head_dim=8, linear_conv_kernel_dim=4,
                        rope_parameters={"rope_type": "default", "rope_theta": None},
                        tie_word_embeddings=False, pad_token_id=0),
    # Kimi Linear: Kimi Delta Attention layers (4 heads of 16, a decay per key dim) around a latent-attention one
    # without rope, numbered from 1 as its linear_attn_config does; a dense first layer, then DeepSeek-V3's experts
    # (sigmoid + correction bias within the best of 2 groups, a shared expert); norms, dt_bias and the router's bias
    # drawn at random
    "kimi_linear": dict(model_type="kimi_linear", linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2],
                                                                      "num_heads": 4, "head_dim": 16,
                                                                      "short_conv_kernel_size": 4},
                        kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24,
                        num_key_value_heads=4, q_lora_rank=None, num_experts=8, num_experts_per_token=2,
                        moe_intermediate_size=48, num_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse"],
                        num_expert_group=2, topk_group=1, routed_scaling_factor=2.446, tie_word_embeddings=False,
                        pad_token_id=0),  # (its default is past the tiny vocabulary)
    # Ling 3: KDA layers with whole gates and the bounded decay, every third layer latent attention rotated on pairs
    # with a gate per head; a dense first layer, then DeepSeek-V3's experts; norms, dt_bias and the router's bias
    # drawn at random; written as released (attention, dense, expert_bias, word_embeddings: transformers' own save)
    "bailing_hybrid": dict(model_type="bailing_hybrid", layer_group_size=3, head_dim=16, kv_lora_rank=32,
                           qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, num_key_value_heads=4,
                           q_lora_rank=None, num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                           n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                           routed_scaling_factor=2.5, kda_lower_bound=-5.0, rope_theta=10000.0,
                           tie_word_embeddings=False, pad_token_id=0),
    # Mamba: every layer one norm and one Mamba-1 mixer (an inner width of 128, a state of 16, step sizes through rank
    # 4), no attention and no MLP: no KV at all; its head tied; norms, the conv's bias and dt_proj's drawn at random
    "mamba": dict(model_type="mamba", state_size=16, conv_kernel=4, expand=2, time_step_rank=4, pad_token_id=0),
    # Falcon-Mamba: Mamba with weightless RMSNorms on the step-size rows, B and C (an epsilon of their own)
    "mamba-falcon": dict(model_type="falcon_mamba", state_size=16, conv_kernel=4, expand=2, mixer_rms_eps=1e-3,
                         tie_word_embeddings=False, pad_token_id=0),
    # Mamba-2 (Mamba-Codestral): every layer one norm and one Mamba-2 mixer (8 heads of 16 in 2 groups, a state of 16,
    # the grouped norm after the gate), its transformers path chunked by 64; norms, the conv's bias and dt_bias drawn
    "mamba2": dict(model_type="mamba2", num_heads=8, head_dim=16, state_size=16, n_groups=2, conv_kernel=4, expand=2,
                   chunk_size=64, tie_word_embeddings=False, pad_token_id=0),
}
