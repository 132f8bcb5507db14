"""Tiny random-weight checkpoints of every supported family, built with transformers (``from_config`` with a
fixed seed, ``save_pretrained``) beside the bundled model's real tokenizer, and their greedy reference
(argmax of a full forward at each step, no KV cache)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.engine.tiny_hybrid_families import HYBRID_FAMILIES
from tests.engine.tiny_latent_families import LATENT_FAMILIES

# the reference side, here for the tests that import it from here
from tests.engine.tiny_reference import (  # noqa: F401
    HUB_LAYOUTS,
    Reference,
    auto_class,
    greedy_full_forward,
    load_reference,
)
from tests.engine.tiny_vl_families import VISION_LANGUAGE_FAMILIES

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.2, rms_norm_eps=1e-6)

# Gemma 3: a window of 24 (so prompts of 300 and chunks of 64 cross it), two sliding layers around a full one,
# the 4B+ models' linear rope scaling on the full layer, a softcap (Gemma 2's; Gemma 3 has none), and norm
# weights drawn at random (Gemma initialises them to 0: a scale of 1 + 0, which would hide the offset)
_GEMMA3_TEXT = dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=24,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                    final_logit_softcapping=30.0, tie_word_embeddings=True)
# Gemma 4: sliding layers (window 24) of 2 KV heads of 16 around full ones of 32-wide heads with the proportional
# rope on a quarter; norms, the router's scales and each layer's scalar drawn around 1 (Gemma 4's norms take their
# weight as stored)
_GEMMA4_TEXT = dict(head_dim=16, global_head_dim=32, sliding_window=24, tie_word_embeddings=True,
                    rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                        "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
RANDOM_NORMS = {"lfm2", "lfm2-moe", "lfm2-lfm3", "nemotron_h", "nemotron_h-moe", "granite_hybrid",
                "granite_hybrid-dense", "granite_hybrid-attention", "cohere", "cohere-2", "cohere_compass",
                "cohere_compass-text", "exaone4", "hunyuan",
                "qwen3_5", "qwen3_5-moe", "qwen3_next", "gemma2", "gemma3", "gemma3-multimodal", "glm4", "glm", "olmo2",
                "olmo3", "deepseek-v3", "deepseek-v2", "deepseek-kimi_k25", "glm4_moe_lite", "minimax_m2", "olmoe",
                "mistral4", "hy_v3", "dots1", "deepseek_v32",
                "deepseek_v32-glm5", "afmoe", "mimo_v2_flash",
                "apertus", "apertus-1p5", "deepseek-sarvam_mla", "sarvam_moe", "youtu", "minicpm3", "axk1", "gemma",
                "vaultgemma", "hyperclovax",
                "flex_olmo", "starcoder2", "jais2", "exaone4-4.5",
                "exaone_moe", "mellum", "phimoe", "cohere2_moe",
                "kolibri1", "hunyuan-a13b", "nemotron", "phi",
                "stablelm", "stablelm-parallel", "bamba", "falcon_h1", "falcon_h1-no_norm", "jamba",
                "gpt_neox", "gpt_neox-sequential", "kimi_linear", "bailing_hybrid", "flint", "olmo_hybrid", "dbrx",
                "mamba", "mamba-falcon", "mamba2"}
RANDOM_AROUND_ONE = {"gemma4", "gemma4-e", "gemma4-unified"}  # norms and scales that multiply as stored: drawn around 1
RANDOM_ACTIVATIONS = {"apertus", "apertus-1p5"}  # the learned parameters of each layer's xIELU drawn at random
# biases, sinks and routers' correction biases drawn at random (transformers starts them at 0), so each one shows
RANDOM_BIASES = {"lfm2-moe", "nemotron_h", "nemotron_h-moe", "granite_hybrid", "granite_hybrid-dense", "gpt_oss",
                 "glm4_moe", "glm4_moe-solar_open", "glm4", "glm", "ernie4_5-moe", "deepseek-v3", "deepseek-kimi_k25",
                 "glm4_moe_lite", "minimax_m2", "seed_oss", "hy_v3", "dots1",
                 "deepseek_v32", "deepseek_v32-glm5", "afmoe", "mimo_v2_flash",
                 "deepseek-sarvam_mla", "sarvam_moe", "helium", "starcoder2", "jais2", "exaone_moe",
                 "granite_swa", "granite_moe_swa", "phimoe", "kolibri1", "nemotron", "phi",
                 "stablelm", "bamba", "falcon_h1", "falcon_h1-no_norm", "jamba",
                 "gpt_neox", "gpt_neox-sequential", "kimi_linear", "bailing_hybrid", "flint",
                 "olmo_hybrid", "mamba", "mamba-falcon", "mamba2"}

FAMILIES: dict[str, dict] = {
    # Llama 3.1+: the rope scaling every such checkpoint has (was served silently wrong)
    "llama3": dict(model_type="llama", rope_theta=500000.0, tie_word_embeddings=False,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=64)),
    "llama-yarn": dict(model_type="llama", rope_theta=10000.0, tie_word_embeddings=True,
                       rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024)),
    # SmolLM3: Llama with NoPE layers (here every second: layer 1 attends unrotated); the released 3B slides on none,
    # here the NoPE layer slides over 24 (use_sliding_window), so the test prompts cross it
    "smollm3": dict(model_type="smollm3", no_rope_layer_interval=2, use_sliding_window=True, sliding_window=24,
                    rope_theta=5000000.0, tie_word_embeddings=True, pad_token_id=0),  # its default is past the vocab
    # IBM Granite 3.x: Llama with its four scalars (granite-3.1-8b's: 12, 1/128, 0.22, 16; here the attention's
    # differs from head_dim ** -0.5 = 0.25 too)
    "granite": dict(model_type="granite", rope_theta=10000000.0, tie_word_embeddings=True, embedding_multiplier=12.0,
                    attention_multiplier=0.125, residual_multiplier=0.22, logits_scaling=16.0),
    # HyperCLOVA X SEED Think: Granite's scalars with a norm on each block's output (drawn at random)
    "hyperclovax": dict(model_type="hyperclovax", rope_theta=10000000.0, tie_word_embeddings=False,
                        embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.22,
                        logits_scaling=16.0, use_post_norm=True),
    # Granite SWA: Granite's scalars, a sink per head (drawn at random) on every layer, sliding layers (a window of 24)
    # around a full one, a rope base per layer: the full layer unrotated, the sliding ones on two bases
    "granite_swa": dict(model_type="granite_swa", tie_word_embeddings=True, embedding_multiplier=12.0,
                        attention_multiplier=0.125, residual_multiplier=0.22, logits_scaling=16.0, sliding_window=24,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        layer_rope_theta=[10000.0, 0, 500000.0]),
    # Granite MoE SWA: the same attention (one base here) in Granite MoE's layer with a shared MLP
    "granite_moe_swa": dict(model_type="granitemoe_swa", num_local_experts=4, num_experts_per_tok=2,
                            shared_intermediate_size=96, tie_word_embeddings=False, embedding_multiplier=12.0,
                            attention_multiplier=0.125, residual_multiplier=0.22, logits_scaling=16.0,
                            sliding_window=24, layer_types=["full_attention", "sliding_attention",
                                                            "sliding_attention"]),
    # Granite 3.x MoE: Granite's scalars, experts on every layer (stacked input_linear/output_linear, the softmax of
    # the top-k logits); its shared variant (granitemoeshared) adds a shared MLP with no gate of its own
    "granite_moe": dict(model_type="granitemoe", num_local_experts=4, num_experts_per_tok=2, rope_theta=10000000.0,
                       tie_word_embeddings=True, embedding_multiplier=12.0, attention_multiplier=0.125,
                       residual_multiplier=0.22, logits_scaling=16.0),
    "granite_moe-shared": dict(model_type="granitemoeshared", num_local_experts=4, num_experts_per_tok=2,
                               shared_intermediate_size=96, rope_theta=10000000.0, tie_word_embeddings=False,
                               embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.22,
                               logits_scaling=16.0),
    "qwen2": dict(model_type="qwen2", rope_theta=1000000.0, tie_word_embeddings=True),
    # InternLM3: Llama under its own keys (qkv_bias, bias), the release's dynamic NTK rope (plain within the context)
    "internlm3": dict(model_type="internlm3", head_dim=16, rope_theta=50000000.0, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "dynamic", "factor": 6.0}),
    # Helium: Llama with rope on adjacent pairs and q/k/v biases (drawn at random; none on o_proj)
    "helium": dict(model_type="helium", head_dim=16, attention_bias=True, rope_theta=20000.0,
                   tie_word_embeddings=False),
    # Meta's CWM: Llama (llama3 rope) with a window (24 here, 8192 there) on three layers of four: the first full
    "cwm": dict(model_type="cwm", head_dim=16, sliding_window=24, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=64, rope_theta=1000000.0)),
    # StarCoder2: Mistral's attention (a window of 24 on every layer) with LayerNorms, biases everywhere (norms and
    # biases drawn at random), an ungated tanh-GELU MLP
    "starcoder2": dict(model_type="starcoder2", sliding_window=24, rope_theta=100000.0, tie_word_embeddings=True),
    # Jais 2: Llama's attention with biases, LayerNorms, an ungated squared-ReLU MLP with biases (drawn at random)
    "jais2": dict(model_type="jais2", rope_theta=500000.0, tie_word_embeddings=False),
    # Nemotron (Minitron's kind): LayerNorms scaling by 1 + weight (norms and biases drawn at random), a squared-ReLU
    # MLP, rope on half of each head
    "nemotron": dict(model_type="nemotron", head_dim=16, attention_bias=True, mlp_bias=True,
                     tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    # Phi-2: attention and the MLP side by side on one LayerNorm (norms and biases drawn at random), rope on half of
    # each head (Phi-2's: 0.4), the LM head's bias
    "phi": dict(model_type="phi", num_key_value_heads=4, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    # StableLM 2: LayerNorms (drawn at random) around Llama's SwiGLU, q/k/v biases, rope on a quarter of each head;
    # its parallel variant (StableLM's use_parallel_residual) too
    "stablelm": dict(model_type="stablelm", use_qkv_bias=True, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    "stablelm-parallel": dict(model_type="stablelm", use_parallel_residual=True, tie_word_embeddings=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.5}),
    # GPT-NeoX (Pythia): attention and the exact-GELU MLP side by side, each on its own LayerNorm, q/k/v fused and
    # interleaved head by head, rope on a quarter of each head (its default rotary_pct); and its sequential kind with
    # the tanh GELU (use_parallel_residual false); norms and biases drawn at random
    "gpt_neox": dict(model_type="gpt_neox", num_key_value_heads=4, tie_word_embeddings=False),
    "gpt_neox-sequential": dict(model_type="gpt_neox", num_key_value_heads=4, use_parallel_residual=False,
                                hidden_act="gelu_new", tie_word_embeddings=False),
    # IQuest-Coder-V1: Llama under its own model type
    "iquestcoder": dict(model_type="iquestcoder", head_dim=32, rope_theta=500000.0, tie_word_embeddings=False),
    # Arcee's AFM: Llama with an ungated squared-ReLU MLP
    "arcee": dict(model_type="arcee", rope_theta=10000.0, tie_word_embeddings=False),
    # Apertus: per-head q/k norms, an ungated xIELU MLP (its parameters drawn at random per layer), Llama 3's rope
    "apertus": dict(model_type="apertus", tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=64, rope_theta=12000000.0)),
    # Apertus 1.5's text model: Apertus's layer, its LM head pruned to the first 900 ids (the others, its image and
    # audio codes, never sampled)
    "apertus-1p5": dict(model_type="apertus1p5_text", output_vocab_size=900, tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", head_dim=32, rope_theta=1000000.0, tie_word_embeddings=True),
    # Seed-OSS: q/k/v biases and (here, as attention_out_bias allows) an o_proj bias, drawn at random
    "seed_oss": dict(model_type="seed_oss", head_dim=32, attention_out_bias=True, rope_theta=10000000.0,
                     tie_word_embeddings=False, pad_token_id=0),
    # Mistral-7B-v0.1: a window on every layer (4096 there; 24 here, so the test prompts cross it)
    "mistral": dict(model_type="mistral", head_dim=32, sliding_window=24, rope_theta=1000000.0,
                    tie_word_embeddings=False),
    # Ministral-8B: Mistral's layer with a window on the layers layer_types names (here the first and last)
    "ministral": dict(model_type="ministral", head_dim=32, sliding_window=24, rope_theta=100000000.0,
                      layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                      tie_word_embeddings=False),
    # Mixtral: Mistral's attention, experts on every layer (block_sparse_moe, w1/w3/w2); a window as Mistral's
    "mixtral": dict(model_type="mixtral", head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=24,
                    rope_theta=1000000.0, tie_word_embeddings=False),
    # Phi-3.5-MoE: Mixtral's layer with LayerNorms, biases on q/k/v/o and the LM head (drawn at random), the
    # sparsemixer router (its eps 0.01), longrope with equal short and long mscales (the release's: served whole)
    "phimoe": dict(model_type="phimoe", num_local_experts=4, num_experts_per_tok=2, attention_bias=True,
                   lm_head_bias=True, tie_word_embeddings=False,
                   rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.9, 2.6, 4.0, 7.5, 9.0, 12.0],
                                 "long_factor": [1.1, 2.0, 3.5, 8.0, 16.0, 40.0, 50.0, 64.0], "short_mscale": 1.2,
                                 "long_mscale": 1.2, "original_max_position_embeddings": 512}),
    # Qwen1.5-MoE / Qwen2-57B-A14B: Qwen2's attention (q/k/v biases), experts beside a gated shared expert
    "qwen2_moe": dict(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                      shared_expert_intermediate_size=96, decoder_sparse_step=1, mlp_only_layers=[2],
                      rope_theta=1000000.0, tie_word_embeddings=False),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                      rope_theta=1000000.0, tie_word_embeddings=False),
    # Mellum 2: Qwen3-MoE's attention and experts (a dense middle layer), sliding layers (a window of 24) rotating
    # with their own base beside a full one (yarn on the full layers' rope)
    "mellum": dict(model_type="mellum", head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                   norm_topk_prob=True, sliding_window=24,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   mlp_layer_types=["sparse", "dense", "sparse"], tie_word_embeddings=False,
                   rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0,
                                                       "original_max_position_embeddings": 1024},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    # Phi-3/Phi-4: fused qkv_proj and gate_up_proj; a window on every layer as Phi-3-mini-4k has (2047 there)
    "phi3": dict(model_type="phi3", sliding_window=24, rope_theta=250000.0, tie_word_embeddings=False),
    # Phi-4-mini / Phi-3.5-mini: 3/4 of each head rotates; longrope (served up to its original 512 here: past it
    # transformers switches to the long factors, 4096 / 512 sets the attention factor)
    "phi3-longrope": dict(model_type="phi3", partial_rotary_factor=0.75, rope_theta=10000.0,
                          tie_word_embeddings=True, original_max_position_embeddings=512,
                          rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.9, 2.6, 4.0, 7.5],
                                        "long_factor": [1.1, 2.0, 3.5, 8.0, 16.0, 40.0],
                                        "original_max_position_embeddings": 512}),
    # GPT-OSS: attention sinks, sliding (24 here, 128 there) and full layers alternating, yarn, experts with
    # biases behind a biased router (softmax of the top-k), a clamped SwiGLU
    "gpt_oss": dict(model_type="gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=24,
                    rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False, "original_max_position_embeddings": 512,
                                     "rope_theta": 150000.0},
                    tie_word_embeddings=False),
    # nanochat: weightless norms (the embeddings normed too), q/k normed after its reversed rope, squared ReLU, the
    # logits softcapped
    "nanochat": dict(model_type="nanochat", head_dim=16, num_key_value_heads=4, final_logit_softcapping=15.0,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # GLM-4-9B-Chat-hf: GLM-4-0414's layer without the norms on the blocks' outputs (biases drawn at random)
    "glm": dict(model_type="glm", head_dim=32, partial_rotary_factor=0.5, attention_bias=True, rope_theta=10000.0,
                tie_word_embeddings=False, pad_token_id=0),
    # GLM-4-0414: rope on adjacent pairs of the first half of each head, norms on each block's output too, q/k/v
    # biases, gate/up fused (its norms and biases drawn at random, so a swapped norm or a lost bias shows)
    "glm4": dict(model_type="glm4", head_dim=32, partial_rotary_factor=0.5, attention_bias=True, rope_theta=10000.0,
                 tie_word_embeddings=False, pad_token_id=0),  # its default is past the vocabulary
    # OLMo 2: norms on each block's output only, q/k normed over all heads at once (norms drawn at random)
    # Cohere's Command R+: attention and the MLP side by side on one bias-free LayerNorm (norms drawn at random), q and
    # k LayerNormed head by head, rope on adjacent pairs, logits times logit_scale; Cohere 2's (Command R7B, Command
    # A): sliding layers (window 24) with rope around a full one without
    "cohere": dict(model_type="cohere", logit_scale=0.0625, layer_norm_eps=1e-5, use_qk_norm=True,
                   tie_word_embeddings=True),
    "cohere-2": dict(model_type="cohere2", logit_scale=0.25, layer_norm_eps=1e-5, sliding_window=24,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                     tie_word_embeddings=True),
    # Command A Plus: Cohere 2's parallel layer with RMSNorms (drawn at random), a dense first layer rotated though
    # full, then sliding layers (a window of 24) around a full one without rope, with experts (the softmax of the
    # top-2 logits) averaged with a shared one
    "cohere2_moe": dict(model_type="cohere2_moe", num_hidden_layers=4, logit_scale=0.25, rms_norm_eps=1e-5,
                        sliding_window=24, num_experts=8, num_experts_per_tok=2, intermediate_size=48,
                        num_shared_experts=1, prefix_dense_intermediate_size=96, first_k_dense_replace=1,
                        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
                        tie_word_embeddings=True),
    # EXAONE 4.0 32B's kind: OLMo 2's layer with Qwen3's per-head q/k norms, sliding layers (window 24) with rope
    # around a global one without (norms drawn at random)
    "exaone4": dict(model_type="exaone4", sliding_window=24, head_dim=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    tie_word_embeddings=False),
    # EXAONE 4.5: a vision-language checkpoint around EXAONE 4.0's text model (model.language_model.*; the vision
    # tower, model.visual.*, not read)
    "exaone4-4.5": dict(model_type="exaone4_5", tie_word_embeddings=False,
                        text_config=dict(model_type="exaone4", sliding_window=24, head_dim=16,
                                         layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                           num_key_value_heads=2, out_hidden_size=64, patch_size=14,
                                           fullatt_block_indexes=[0])),
    # K-EXAONE: EXAONE 4.0's attention (sliding layers with rope, a window of 24, around a global one without) in a
    # pre-norm layer, then DeepSeek-V3's experts after a dense first layer (two groups, the correction bias drawn at
    # random) beside a shared one
    "exaone_moe": dict(model_type="exaone_moe", sliding_window=24, head_dim=16,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention"], num_experts=8,
                       num_experts_per_tok=2, moe_intermediate_size=48, num_shared_experts=1,
                       first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                       tie_word_embeddings=False),
    # Kolibri-1: EXAONE 4.0's attention (sliding layers with rope, a window of 24, around a full one without) in
    # GLM-4's layer (norms drawn at random), experts chosen by logit plus correction bias (drawn at random) beside a
    # shared one
    "kolibri1": dict(model_type="kolibri1", sliding_window=24, head_dim=16,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"], num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=64,
                     norm_topk_prob=True, tie_word_embeddings=False),
    # Hunyuan dense (Hunyuan-MT-7B's kind): q/k RMSNormed head by head after rope (norms drawn at random), the rope
    # NTK-alpha scaled as its checkpoints write it ("dynamic" with a fixed alpha)
    "hunyuan": dict(model_type="hunyuan_v1_dense", head_dim=16, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0, "factor": 1.0}),
    # Hunyuan-A13B: the dense model's layer with experts on every layer (the float32 softmax's top-2) beside an
    # ungated shared MLP
    "hunyuan-a13b": dict(model_type="hunyuan_v1_moe", head_dim=16, num_experts=8, moe_topk=2, intermediate_size=48,
                         tie_word_embeddings=False,
                         rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0,
                                          "factor": 1.0}),
    # OLMo 1.7: weightless LayerNorms, q/k/v clamped at 2 (values past it here: the clamp shows)
    "olmo": dict(model_type="olmo", clip_qkv=2.0, rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=0),
    # Flint: Qwen3-MoE's layer with sinks (drawn at random), a window of 24 on the middle layer (which alone rotates),
    # experts by the sigmoid of the router's logits, no bias, beside an ungated shared expert; a dense first layer
    "flint": dict(model_type="flint", head_dim=16, sliding_window=24,
                  layer_types=["full_attention", "sliding_attention", "full_attention"], mlp_only_layers=[0],
                  num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=64,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                  pad_token_id=0),
    # DBRX: fused q/k/v clamped at 2, bias-free LayerNorms (drawn at random), 4 experts on every layer, top-2 of the
    # softmax renormalised, stored stacked (w1, v1, w2) as released
    "dbrx": dict(model_type="dbrx", d_model=64, n_heads=4, n_layers=3, max_seq_len=4096, tie_word_embeddings=False,
                 attn_config={"kv_n_heads": 2, "clip_qkv": 2.0, "rope_theta": 10000.0},
                 ffn_config={"ffn_hidden_size": 48, "moe_num_experts": 4, "moe_top_k": 2}, pad_token_id=0),
    "olmo2": dict(model_type="olmo2", rope_theta=500000.0, tie_word_embeddings=False, pad_token_id=0),
    # OLMo 3: OLMo 2's layer with sliding (24 here) and full layers (sliding, full, sliding), yarn on the full layers
    # only (the long-context releases'), plain rope of the same base on the sliding ones
    "olmo3": dict(model_type="olmo3", sliding_window=24, layer_types=["sliding_attention", "full_attention",
                                                                      "sliding_attention"],
                  rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                                "attention_factor": 1.2}, rope_theta=500000.0, tie_word_embeddings=False,
                  pad_token_id=0),
    # ERNIE 4.5: interleaved rope over the whole head; its MoE: softmax routing with a correction bias in the choice
    # (drawn at random), experts from the second layer, two shared experts
    "ernie4_5": dict(model_type="ernie4_5", head_dim=32, rope_theta=500000.0, tie_word_embeddings=True),
    "ernie4_5-moe": dict(model_type="ernie4_5_moe", head_dim=16, moe_num_experts=8, moe_k=2, moe_intermediate_size=48,
                         moe_num_shared_experts=2, moe_layer_start_index=1, rope_theta=500000.0,
                         tie_word_embeddings=False),
    # GLM-4.5: q/k/v biases and q/k norms, rope on half of each head, a dense first layer, then sigmoid routing
    # with a correction bias (drawn at random, as RANDOM_BIASES' are) among the best of two groups, routed weights
    # times 2.5, and two shared experts
    "glm4_moe": dict(model_type="glm4_moe", head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=48, n_shared_experts=2, first_k_dense_replace=1, n_group=2, topk_group=1,
                     routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
                     partial_rotary_factor=0.5, rope_theta=1000000.0, tie_word_embeddings=False),
    # EXAONE 3.5: Llama (llama3 rope scaling, as 3.5 has) written under its GPT-2-style names
    "exaone": dict(model_type="exaone", rope_theta=1000000.0, tie_word_embeddings=False,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=64)),
    # dots.llm1: Qwen3's attention (a window of 24 from the third layer on), DeepSeek-V3's experts after a dense
    # first layer (sigmoid routing with its correction bias drawn at random, two groups), two shared experts
    "dots1": dict(model_type="dots1", head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                  n_shared_experts=2, first_k_dense_replace=1, n_group=2, topk_group=1, norm_topk_prob=True,
                  routed_scaling_factor=2.5, sliding_window=24, max_window_layers=2, tie_word_embeddings=False),
    # Arcee's AFMoE (Trinity): sliding layers with rope (a window of 24) around a full one without, per-head q/k
    # norms, a sigmoid gate on every value of the attention's output, sandwich norms, the embeddings scaled (muP),
    # then experts (sigmoid routing with expert_bias drawn at random, times 2.5) beside a shared one after a dense layer
    "afmoe": dict(model_type="afmoe", head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                  num_shared_experts=1, num_dense_layers=1, route_scale=2.5, global_attn_every_n_layers=2,
                  sliding_window=24, mup_enabled=True, tie_word_embeddings=False),
    # MiMo-V2-Flash: a full layer (two KV heads, for eight query heads) then sliding ones (a window of 24, four KV
    # heads, sinks drawn at random), 24-wide keys and 16-wide values scaled by 0.707, rope on a third of each head (its
    # own base per kind), then DeepSeek-V3's experts without a shared one (two groups, a random correction bias)
    "mimo_v2_flash": dict(model_type="mimo_v2_flash", head_dim=24, v_head_dim=16, num_attention_heads=8,
                          num_key_value_heads=2,
                          layer_types=["full_attention", "sliding_attention", "sliding_attention"], sliding_window=24,
                          n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=48, n_group=2,
                          topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False),
    # Hy3: Qwen3's per-head q/k norms, sigmoid routing (no groups; the correction bias drawn at random) times 2.5, an
    # ungated shared expert; the layers' kinds as mlp_layer_types lists them (a dense middle one here)
    "hy_v3": dict(model_type="hy_v3", head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                  num_shared_experts=1, router_scaling_factor=2.5, mlp_layer_types=["sparse", "dense", "sparse"],
                  rope_parameters={"rope_type": "default", "rope_theta": 11158840.0}, tie_word_embeddings=False),
    # Solar Open: GLM-4.5's experts (on every layer) under Llama's attention, the whole head rotated; q/k/v biases
    # (the release has none; drawn at random here, as the router's correction bias)
    "glm4_moe-solar_open": dict(model_type="solar_open", head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                                moe_intermediate_size=48, n_shared_experts=1, n_group=2, topk_group=1,
                                routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=True,
                                tie_word_embeddings=False),
    # Sarvam-30B: GLM-4.5's model (q/k/v biases and norms drawn at random, the whole head rotated, two groups) under
    # Bailing-MoE's names, q/k/v stored fused
    "sarvam_moe": dict(model_type="sarvam_moe", head_dim=16, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=48, num_shared_experts=1, first_k_dense_replace=1, n_group=2,
                       topk_group=1, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
                       tie_word_embeddings=False),
    # OLMoE: OLMo 2's whole-projection q/k norms in a pre-norm layer, softmax-routed experts on every layer
    "olmoe": dict(model_type="olmoe", num_experts=8, num_experts_per_tok=2, intermediate_size=48, rope_theta=10000.0,
                  tie_word_embeddings=False, pad_token_id=0),
    # FlexOlmo: OLMo 2's layer (norms drawn at random) with OLMoE's experts on every layer
    "flex_olmo": dict(model_type="flex_olmo", num_experts=8, num_experts_per_tok=2, intermediate_size=48,
                      rope_theta=500000.0, tie_word_embeddings=False, pad_token_id=0),
    # MiniMax-M2: q/k normed over all heads at once (norms drawn at random), rope on half of each head (the
    # released configs' rotary_dim), sigmoid-routed experts on every layer (correction bias drawn at random)
    "minimax_m2": dict(model_type="minimax_m2", head_dim=32, rotary_dim=16, num_local_experts=8,
                       num_experts_per_tok=2, intermediate_size=48, rope_theta=5000000.0, tie_word_embeddings=False),
    # Gemma 1: Gemma's norms (drawn at random) before attention and the MLP only, Llama's attention
    "gemma": dict(model_type="gemma", head_dim=16, rope_theta=10000.0, tie_word_embeddings=True),
    # Gemma 2: sliding (24 here, 4096 there) and full layers alternating from the first, one rope base, no q/k
    # norms, every attention score softcapped (at 3 here, where the tiny model's scores reach it; 50 there) and
    # the logits (30)
    "gemma2": dict(model_type="gemma2", head_dim=16, query_pre_attn_scalar=24, sliding_window=24,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   attn_logit_softcapping=3.0, final_logit_softcapping=30.0, rope_theta=10000.0,
                   tie_word_embeddings=True),
    # VaultGemma: Gemma 2's model without the norms after attention and the MLP (norms drawn at random)
    "vaultgemma": dict(model_type="vaultgemma", head_dim=16, query_pre_attn_scalar=24, sliding_window=24,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                       attn_logit_softcapping=3.0, final_logit_softcapping=30.0, rope_theta=10000.0,
                       tie_word_embeddings=True),
    # Llama 4 as Maverick's text model is (its wrapper's reading: tests/engine/test_llama4.py): experts (top-2 here, so
    # that the sum shows; top-1 there) on every other layer beside a shared one, dense MLPs between, no rope on every
    # fourth layer (the last here), L2 q/k norms, llama3 rope scaling; the query temperature's floor at 64 (8192 there)
    # so that the 300-token prompts cross it; the rotated layers' chunks of 48 (8192 there), so that the prompts span
    # six, the prefix hit (256) ends mid-chunk and the prefill's steps of 64 cross chunk boundaries
    "llama4": dict(model_type="llama4_text", tie_word_embeddings=False, head_dim=16, num_hidden_layers=4,
                   num_local_experts=8, num_experts_per_tok=2, intermediate_size=48, intermediate_size_mlp=96,
                   interleave_moe_layer_step=2, floor_scale=64, attention_chunk_size=48,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 256}),
    "gemma3": dict(model_type="gemma3_text", **_GEMMA3_TEXT),
    # Gemma 4 as the 31B and 26B-A4B are: the full layers' values are their keys (attention_k_eq_v) with one KV
    # head (a slot of 2 sliding heads' width: written twice), experts beside every dense MLP, the logits capped
    "gemma4": dict(model_type="gemma4_text", **_GEMMA4_TEXT,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                   num_hidden_layers=4, attention_k_eq_v=True, num_global_key_value_heads=1, enable_moe_block=True,
                   num_experts=8, top_k_experts=2, moe_intermediate_size=48, hidden_size_per_layer_input=0,
                   final_logit_softcapping=30.0),
    # Gemma 4 as the E2B and E4B are (Gemma4ForConditionalGeneration with vision and audio towers, not read): the
    # last two layers attend over the KV of the last earlier layer of their kind with MLPs twice as wide, per-layer
    # inputs of 8 per layer; the sliding layers' heads fill half the slot (written twice)
    "gemma4-e": dict(model_type="gemma4", per_layer_vocab=True,
                     text_config=_GEMMA4_TEXT | dict(
                         layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                                      "full_attention"], num_hidden_layers=5, num_kv_shared_layers=2,
                         use_double_wide_mlp=True, hidden_size_per_layer_input=8),
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=14,
                                        position_embedding_size=64),
                     audio_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       subsampling_conv_channels=[8, 4], output_proj_dims=32)),
    # the encoder-free Gemma 4 12B (Gemma4UnifiedForConditionalGeneration: patch and audio-frame embedders, not read):
    # Gemma 4's text model without per-layer inputs or experts
    "gemma4-unified": dict(model_type="gemma4_unified",
                           text_config=_GEMMA4_TEXT | dict(layer_types=["sliding_attention", "full_attention",
                                                                        "sliding_attention"]),
                           vision_config=dict(patch_size=2, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=8,
                                              output_proj_dims=64),
                           audio_config=dict(audio_embed_dim=16)),
    # the 4B/12B/27B checkpoints: Gemma3ForConditionalGeneration, the text model under language_model.* (no
    # softcap: as in Google's files; transformers' multimodal class would not apply one)
    "gemma3-multimodal": dict(model_type="gemma3", text_config=_GEMMA3_TEXT | {"final_logit_softcapping": None},
                              mm_tokens_per_image=4,
                              vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=28, patch_size=14)),
    **LATENT_FAMILIES,
    **HYBRID_FAMILIES,
    **VISION_LANGUAGE_FAMILIES,
}


def build_family(name: str, root: Path, tokenizer_hf) -> Path:
    """``root/name``: config.json, sharded safetensors with their index, generation_config.json, tokenizer."""
    from transformers import AutoConfig

    spec = dict(FAMILIES[name])
    model_type = spec.pop("model_type")
    ids = dict(vocab_size=len(tokenizer_hf), bos_token_id=1, eos_token_id=2)
    if spec.pop("per_layer_vocab", False):  # Gemma 4's per-layer inputs: a table of the same vocabulary
        ids["vocab_size_per_layer_input"] = len(tokenizer_hf)
    if "text_config" in spec:  # a multimodal checkpoint: the shape is its text model's
        spec["text_config"] = ids | SHAPE | spec["text_config"]
        config = AutoConfig.for_model(model_type, **spec)
    else:
        config = AutoConfig.for_model(model_type, **ids, **(SHAPE | spec))
    torch.manual_seed(1234)
    model = auto_class(model_type).from_config(config, dtype=torch.float32)
    if name in RANDOM_NORMS:
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "norm" in param_name:
                    param.normal_(0.0, 0.3)
    if name in RANDOM_AROUND_ONE:
        with torch.no_grad():
            for param_name, param in [*model.named_parameters(), *model.named_buffers()]:
                if param_name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")):
                    param.normal_(1.0, 0.3)
    if name in RANDOM_ACTIVATIONS:
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):
                    param.normal_(0.0, 0.5)
    if name in RANDOM_BIASES:
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith(("bias", "sinks")):
                    param.normal_(0.0, 0.5)
            for buffer_name, buffer in model.named_buffers():
                if buffer_name.endswith(("e_score_correction_bias", "expert_bias")):
                    buffer.normal_(0.0, 0.5)
            for param_name, param in model.named_parameters():  # ERNIE's correction bias is a parameter
                if param_name.endswith("e_score_correction_bias"):
                    param.normal_(0.0, 0.1)  # its choice adds it to probabilities (about 1 / 8 each here)
    path = root / name
    model.save_pretrained(str(path), max_shard_size="2MB")
    if name in HUB_LAYOUTS:
        HUB_LAYOUTS[name](path)
    tokenizer_hf.save_pretrained(str(path))
    return path
