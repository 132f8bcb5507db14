"""The tiny twins of the latent-attention families (DeepSeek-V2/V3/V3.2, GLM-5, Kimi K2.5, Sarvam-105B, Youtu-LLM,
A.X-K1, MiniCPM3, GLM-4.7-Flash), part of :data:`tests.engine.tiny_families.FAMILIES` (shapes from its ``SHAPE``)."""

from __future__ import annotations

# (num_key_value_heads as many as the heads, as every latent-attention config has: transformers needs it)
_LATENT = dict(kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, num_key_value_heads=4)
_DEEPSEEK_V3 = dict(model_type="deepseek_v3", q_lora_rank=48, **_LATENT, n_routed_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                    routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                     "rope_theta": 10000.0})

LATENT_FAMILIES: dict[str, dict] = {
    # DeepSeek-V3: latent attention (q through a 48-wide bottleneck, a 32-wide latent, values of another width than
    # the keys' nope part), yarn with its mscale on the scores, rope on adjacent pairs, a dense first layer, then
    # GLM-4.5's sigmoid routing (its correction bias drawn at random) and one shared expert; norms drawn at random
    "deepseek-v3": _DEEPSEEK_V3,
    # DeepSeek-V3.2: V3's layers with DeepSeek Sparse Attention: each query attends the 40 earlier tokens its indexer
    # (16 heads of 32: with few heads, tokens whose every head's relu is 0 tie at a score of 0, where transformers'
    # pick is arbitrary) scores highest, so the test prompts (300 tokens) pick; norms, biases (the index key's
    # LayerNorm's among them) drawn at random
    "deepseek_v32": dict(model_type="deepseek_v32", q_lora_rank=48, **_LATENT, n_routed_experts=8,
                         num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1,
                         n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, index_topk=40,
                         index_n_heads=16, index_head_dim=32, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                          "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                          "rope_theta": 10000.0}),
    # GLM-5: DeepSeek-V3.2's model with its indexer's rope interleaved, and layers that reuse the previous indexed
    # layer's picks (indexer_types: the second here)
    "deepseek_v32-glm5": dict(model_type="glm_moe_dsa", q_lora_rank=48, **_LATENT, n_routed_experts=8,
                              num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                              first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                              norm_topk_prob=True, index_topk=40, index_n_heads=16, index_head_dim=32,
                              indexer_types=["full", "shared", "full"], tie_word_embeddings=False),
    # Sarvam-105B: DeepSeek-V3's model with one q projection, sigmoid routing over one group
    "deepseek-sarvam_mla": dict(model_type="sarvam_mla", q_lora_rank=None, **_LATENT, n_routed_experts=8,
                                num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                                first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                                tie_word_embeddings=False,
                                rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                 "original_max_position_embeddings": 1024, "beta_fast": 32.0,
                                                 "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    # Youtu-LLM: DeepSeek-V3's latent attention (q through its bottleneck) over a dense MLP on every layer, tied
    "youtu": dict(model_type="youtu", q_lora_rank=48, **_LATENT, rope_theta=1600000.0, tie_word_embeddings=True),
    # A.X-K1: DeepSeek-V3's model with a norm on each sparse block's output (drawn at random), a dense first layer
    # (storing one it does not use), and routers without a correction bias, as released (tiny_reference.HUB_LAYOUTS)
    "axk1": dict(model_type="axk1", q_lora_rank=48, **_LATENT, n_routed_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=48, n_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse"], n_group=2,
                 topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # MiniCPM3: the latent attention with rope on halves, a dense MLP, muP's embedding, residual and head scalars;
    # longrope as the release has it (served within its original context)
    "minicpm3": dict(model_type="minicpm3", q_lora_rank=48, **_LATENT, scale_emb=12, scale_depth=1.4,
                     dim_model_base=16, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                      "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
                                      "long_factor": [1.2, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0],
                                      "original_max_position_embeddings": 1024}),
    # DeepSeek-V2(-Lite): one q projection, softmax routing limited to the best of 2 groups (3 experts of its 4: the
    # limit then changes the choice), weights times 16
    "deepseek-v2": dict(model_type="deepseek_v2", q_lora_rank=None, **_LATENT, n_routed_experts=8,
                        num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=2, first_k_dense_replace=1,
                        topk_method="group_limited_greedy", n_group=2, topk_group=1, routed_scaling_factor=16.0,
                        rope_theta=10000.0, tie_word_embeddings=False),
    # GLM-4.7-Flash: DeepSeek-V3's attention (values wider than the keys' nope part here), GLM-4.5's experts,
    # dense or sparse per mlp_layer_types (sparse, dense, sparse here)
    "glm4_moe_lite": dict(model_type="glm4_moe_lite", q_lora_rank=48, num_key_value_heads=4, kv_lora_rank=32,
                          qk_rope_head_dim=16, qk_nope_head_dim=24, v_head_dim=32, n_routed_experts=8,
                          num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                          routed_scaling_factor=1.8, mlp_layer_types=["sparse", "dense", "sparse"],
                          rope_theta=1000000.0, tie_word_embeddings=False, pad_token_id=0,
                          rms_norm_eps=1e-5),  # GLM-4.7-Flash's (its latent norms keep 1e-6, as transformers')
    # Kimi K2.5 (K2.6): Kimi_K25ForConditionalGeneration around DeepSeek-V3's text model, written as the released
    # files are (language_model.model.layers.*, language_model.lm_head, vision_tower.*, mm_projector.*: HUB_LAYOUTS);
    # untied as the releases write it (the class's default ties)
    "deepseek-kimi_k25": dict(model_type="kimi_k25", tie_word_embeddings=False, projection_hidden_size=32,
                     text_config=_DEEPSEEK_V3 | {"model_type": "kimi_k2"},
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, pos_emb_height=4, pos_emb_width=4)),
}
