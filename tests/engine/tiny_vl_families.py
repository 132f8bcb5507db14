"""The tiny twins of the vision-language checkpoints whose text model is served (Mistral 3, Mistral Small 4, Qwen-VL,
Cohere's North) and of Devstral 2's and North's text models alone, part of
:data:`tests.engine.tiny_families.FAMILIES`."""

from __future__ import annotations

# Ministral 3: yarn as Mistral sets it, and the attention temperature past the yarn's original context (64 here: the
# test prompts reach 300 tokens, four periods on)
_MINISTRAL3_TEXT = dict(model_type="ministral3", head_dim=16, tie_word_embeddings=False, sliding_window=None,
                        rope_parameters={"rope_type": "yarn", "type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                                         "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1})
# (its routed weights times 2, so the scaling shows; the temperature's period 64, as Ministral 3's)
_MISTRAL4_TEXT = dict(model_type="mistral4", q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=16,
                      qk_nope_head_dim=16, v_head_dim=24, num_key_value_heads=4, n_routed_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1,
                      n_group=2, topk_group=1, routed_scaling_factor=2.0, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "yarn", "type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                       "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
                                       "partial_rotary_factor": 0.5})
_MROPE = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3]}
_QWEN3_VL_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                        deepstack_visual_indexes=[0], patch_size=14)

VISION_LANGUAGE_FAMILIES: dict[str, dict] = {
    # Ministral 3: Mistral3ForConditionalGeneration around a ministral3 text model, under language_model.* (tied as
    # the text model says: transformers ties by the top level's flag, which the released files leave untied)
    "mistral3": dict(model_type="mistral3", text_config=_MINISTRAL3_TEXT, tie_word_embeddings=False,
                                vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                   num_attention_heads=2, head_dim=16, image_size=28, patch_size=14)),
    # Devstral 2: the ministral3 text model on its own
    "mistral3-text": dict(_MINISTRAL3_TEXT),
    # Mistral Small 4: Mistral3ForConditionalGeneration around a mistral4 text model (DeepSeek-V3's latent attention
    # with Ministral 3's query temperature, softmax routing within the best of 2 groups, a shared expert; norms drawn
    # at random)
    "mistral4": dict(model_type="mistral3", text_config=_MISTRAL4_TEXT, tie_word_embeddings=False,
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, head_dim=16, image_size=28, patch_size=14)),
    # Qwen3-VL: Qwen3's text model under model.language_model.* with interleaved M-RoPE (plain rope for text: its
    # sections, 2 + 3 + 3 of the 8 frequencies, all see the same position), the vision tower beside it (not read);
    # tied as the top level says (the text config's true is what transformers 5 writes there)
    "qwen_vl": dict(model_type="qwen3_vl", tie_word_embeddings=False, vision_config=_QWEN3_VL_VISION,
                    text_config=dict(model_type="qwen3_vl_text", head_dim=16, rope_parameters=_MROPE | {
                        "mrope_interleaved": True})),
    # Qwen3-VL-MoE: Qwen3-MoE's layers (a dense middle one), experts stacked and written transposed as the released
    # files store them ([E, hidden, 2·inter]: HUB_LAYOUTS)
    "qwen_vl-moe": dict(model_type="qwen3_vl_moe", tie_word_embeddings=False, vision_config=_QWEN3_VL_VISION,
                        text_config=dict(model_type="qwen3_vl_moe_text", head_dim=16, num_experts=8,
                                         num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1,
                                         mlp_only_layers=[1], rope_parameters=_MROPE | {"mrope_interleaved": True})),
    # Qwen2.5-VL: Qwen2's text model (q/k/v biases), written as its released files are (model.layers.*, visual.*)
    "qwen_vl-2.5": dict(model_type="qwen2_5_vl", tie_word_embeddings=False,
                        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                           out_hidden_size=64, patch_size=14, fullatt_block_indexes=[0]),
                        text_config=dict(model_type="qwen2_5_vl_text", rope_parameters=_MROPE)),
    # Cohere's North (CohereCompassForConditionalGeneration: Qwen3-VL's wrapper around Cohere 2's layer): sliding
    # layers (a window of 24) rotating their two halves around a full layer without rope (its rope entry null), the
    # logits scaled; the vision tower not read
    "cohere_compass": dict(model_type="cohere_compass", tie_word_embeddings=True, vision_config=_QWEN3_VL_VISION,
                           text_config=dict(model_type="cohere_compass_text", logit_scale=0.25, sliding_window=24,
                                            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                            rope_parameters={"sliding_attention": _MROPE | {"rope_theta": 10000.0},
                                                             "full_attention": None})),
    # its text model alone, both kinds rotating with a base each (the sliding layers' their own plain rope), and a
    # null logit_scale (1)
    "cohere_compass-text": dict(model_type="cohere_compass_text", sliding_window=24,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                 "full_attention": {"rope_type": "default", "rope_theta": 500000.0}}),
}
