"""Published config files read into the right sliding windows (per layer, as transformers sets them) and experts, beyond
the family test's parity: Phi-3/Phi-4, Mistral, Ministral, Mixtral, Qwen2/Qwen3 with ``use_sliding_window``, Qwen2-MoE,
Qwen3-MoE, EXAONE 3.5 (its own key names), dots.llm1; Phi-3.5 and Phi-4-mini's longrope (served up to its original
context) and partial rotary. Gemma 3's: ``test_gemma3.py``; GPT-OSS's: ``test_gpt_oss.py``."""

from __future__ import annotations

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf

# microsoft/phi-4 and microsoft/Phi-3-mini-4k-instruct's config.json, as published
PHI4 = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 100257,
    "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 17920, "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
    "num_hidden_layers": 40, "num_key_value_heads": 10, "original_max_position_embeddings": 16384,
    "pad_token_id": 100349, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 250000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 100352,
}
PHI3_MINI_4K = {
    "architectures": ["Phi3ForCausalLM"], "bos_token_id": 1, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "pad_token_id": 32000, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "vocab_size": 32064,
}


def test_phi4_is_the_plain_decoder_with_fused_projections():
    cfg = config_from_hf(PHI4)
    shape = (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    assert shape == ("phi3", 40, 40, 10, 128)
    assert not cfg.has_windows and cfg.max_position == 16384 and cfg.rope_theta == 250000


def test_phi3_mini_4k_has_its_window_on_every_layer_and_keeps_its_whole_context():
    cfg = config_from_hf(PHI3_MINI_4K)
    assert cfg.layer_windows == (2047,) * 32 and cfg.max_position == 4096


def test_a_window_past_the_context_is_no_window():
    assert not config_from_hf(PHI4 | {"sliding_window": 262144}).has_windows


LONGROPE = {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}


def test_phi4_mini_rotates_three_quarters_of_each_head_and_is_served_up_to_its_original_context():
    """microsoft/Phi-4-mini-instruct: 128-dim heads, 96 of them rotating, longrope from 4096 to 131072."""
    mini = PHI3_MINI_4K | {"hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
                           "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
                           "original_max_position_embeddings": 4096, "sliding_window": 262144,
                           "rope_scaling": LONGROPE, "tie_word_embeddings": True}
    cfg = config_from_hf(mini)
    assert cfg.head_dim == 128 and cfg.rotary_dim == 96 and cfg.max_position == 4096 and not cfg.has_windows
    assert cfg.rope_scaling.rope_type == "longrope" and cfg.rope_scaling.factor == 32.0
    assert len(cfg.rope_scaling.short_factor) == 48


def test_phi35_mini_longrope_su_is_longrope():
    cfg = config_from_hf(PHI3_MINI_4K | {"max_position_embeddings": 131072, "sliding_window": 262144,
                                         "rope_scaling": LONGROPE | {"type": "su"}})
    assert cfg.rope_scaling.rope_type == "longrope" and cfg.rotary_dim is None and cfg.max_position == 4096


def test_longrope_takes_the_top_levels_original_context_first_and_phi3s_default_without_one():
    """transformers' precedence: the top level's original_max_position_embeddings over the scaling's own, and
    Phi3Config's 4096 where neither says."""
    base = PHI3_MINI_4K | {"max_position_embeddings": 131072, "sliding_window": None}
    both = config_from_hf(base | {"original_max_position_embeddings": 4096,
                                  "rope_scaling": LONGROPE | {"original_max_position_embeddings": 2048}})
    assert both.max_position == 4096 and both.rope_scaling.original_max_position == 4096
    assert both.rope_scaling.factor == 32.0
    neither = config_from_hf({k: v for k, v in base.items() if k != "original_max_position_embeddings"}
                             | {"rope_scaling": LONGROPE})
    assert neither.max_position == 4096 and neither.rope_scaling.original_max_position == 4096


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "mistral"])
def test_a_partial_rotary_factor_is_refused_where_transformers_rotates_the_whole_head(model_type):
    with pytest.raises(ModelLoadError, match="partial_rotary_factor is not supported"):
        config_from_hf(LLAMA_SHAPE | {"model_type": model_type, "partial_rotary_factor": 0.5})


@pytest.mark.parametrize(("change", "named"), [
    ({"rope_scaling": LONGROPE | {"short_factor": [1.0] * 40}}, "40 short factors"),
    ({"rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48}}, "short_factor"),
    ({"partial_rotary_factor": 0.7}, "partial_rotary_factor 0.7"),
])
def test_what_longrope_or_a_partial_rotary_cannot_be_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(PHI3_MINI_4K | {"max_position_embeddings": 8192} | change)


LLAMA_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "max_position_embeddings": 32768, "vocab_size": 1000}


def test_mistral_7b_v01_has_its_window_on_every_layer_and_later_mistrals_none():
    v01 = config_from_hf(LLAMA_SHAPE | {"model_type": "mistral", "sliding_window": 4096})
    assert v01.layer_windows == (4096,) * 4 and v01.max_position == 32768
    assert not config_from_hf(LLAMA_SHAPE | {"model_type": "mistral", "sliding_window": None}).has_windows
    assert config_from_hf(LLAMA_SHAPE | {"model_type": "mistral"}).layer_windows == (4096,) * 4  # transformers'


def test_ministral_slides_on_the_layers_its_layer_types_name():
    kinds = ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]
    ministral = config_from_hf(LLAMA_SHAPE | {"model_type": "ministral", "sliding_window": 8192, "layer_types": kinds})
    assert ministral.layer_windows == (None, 8192, 8192, 8192)
    assert config_from_hf(LLAMA_SHAPE | {"model_type": "ministral"}).layer_windows == (4096,) * 4  # transformers'
    assert not config_from_hf(LLAMA_SHAPE | {"model_type": "ministral", "sliding_window": None}).has_windows
    with pytest.raises(ModelLoadError, match=r"(?s)ministral: config.json is not a MinistralConfig.*layer_types"):
        config_from_hf(LLAMA_SHAPE | {"model_type": "ministral", "layer_types": kinds[:3]})


def test_windows_no_shorter_than_the_served_context_are_dropped():
    """A node capped at 4096 tokens serves Mistral-7B-v0.1 without windows (they hide nothing there)."""
    v01 = config_from_hf(LLAMA_SHAPE | {"model_type": "mistral", "sliding_window": 4096})
    assert not v01.served_within(4096).has_windows and v01.served_within(4097).layer_windows == (4096,) * 4
    assert v01.served_within(None) == v01
    gemma_like = v01.__class__(**{**vars(v01), "layer_windows": (512, None, 512, None)})
    assert gemma_like.served_within(512).layer_windows == ()
    assert gemma_like.served_within(513).layer_windows == (512, None, 512, None)


def test_a_node_capped_below_the_window_keeps_the_deterministic_mode_and_the_cpu_kernel(family_dir):
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine

    settings = dict(model_path=str(family_dir("mistral")), dtype="float32", num_kv_blocks=16, max_model_len=24)
    capped = LLMEngine.from_config(EngineConfig(**settings))
    assert not capped.model.config.has_windows and capped.max_model_len == 24
    deterministic = LLMEngine.from_config(EngineConfig(**settings, deterministic=True))
    assert deterministic.runner.attention.name == "cpu_fixed_order"


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_windows_hold_from_max_window_layers_on_and_only_with_use_sliding_window(model_type):
    qwen = LLAMA_SHAPE | {"model_type": model_type, "sliding_window": 4096, "max_window_layers": 2}
    assert not config_from_hf(qwen).has_windows  # use_sliding_window defaults to false (every Qwen release)
    assert config_from_hf(qwen | {"use_sliding_window": True}).layer_windows == (None, None, 4096, 4096)
    kinds = ["sliding_attention", "full_attention"] * 2
    assert config_from_hf(qwen | {"use_sliding_window": True, "layer_types": kinds}).layer_windows == \
        (4096, None, 4096, None)


def test_qwen3_moe_window_holds_on_every_layer():
    moe = LLAMA_SHAPE | {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                         "moe_intermediate_size": 32, "sliding_window": 4096}
    assert not config_from_hf(moe).has_windows
    assert config_from_hf(moe | {"use_sliding_window": True}).layer_windows == (4096,) * 4


# mistralai/Mixtral-8x7B-Instruct-v0.1's config.json, as published
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}


def test_mixtral_8x7b_has_eight_experts_of_its_intermediate_size_on_every_layer_and_no_window():
    cfg = config_from_hf(MIXTRAL_8X7B)
    assert (cfg.architecture, cfg.head_dim, cfg.num_kv_heads, cfg.max_position) == ("mixtral", 128, 8, 32768)
    assert cfg.moe is not None and (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.intermediate_size) == (8, 2, 14336)
    assert cfg.moe.norm_topk_prob and cfg.moe.sparse_layers == tuple(range(32))
    assert not cfg.has_windows
    assert config_from_hf(MIXTRAL_8X7B | {"sliding_window": 4096}).layer_windows == (4096,) * 32
    with pytest.raises(ModelLoadError, match="num_local_experts"):
        config_from_hf({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"})


def test_mixtral_checkpoint_names_map_to_the_shared_decoders():
    from services.engine.model.mixtral import mixtral_tensor_name

    p = "model.layers.7."
    assert mixtral_tensor_name(p + "block_sparse_moe.gate.weight") == p + "mlp.gate.weight"
    assert mixtral_tensor_name(p + "block_sparse_moe.experts.5.w1.weight") == p + "mlp.experts.5.gate_proj.weight"
    assert mixtral_tensor_name(p + "block_sparse_moe.experts.5.w3.weight") == p + "mlp.experts.5.up_proj.weight"
    assert mixtral_tensor_name(p + "block_sparse_moe.experts.5.w2.weight") == p + "mlp.experts.5.down_proj.weight"
    assert mixtral_tensor_name(p + "self_attn.q_proj.weight") == p + "self_attn.q_proj.weight"


# Qwen/Qwen1.5-MoE-A2.7B's config.json, as published
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
    "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_qwen15_moe_has_sixty_experts_beside_a_shared_one_and_qkv_biases():
    cfg = config_from_hf(QWEN15_MOE)
    moe = cfg.moe
    assert (cfg.architecture, cfg.qkv_bias, cfg.o_bias, cfg.has_windows) == ("qwen2_moe", True, False, False)
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_intermediate_size) == \
        (60, 4, 1408, 5632)
    assert not moe.norm_topk_prob and moe.sparse_layers == tuple(range(24))
    with pytest.raises(ModelLoadError, match="use_sliding_window"):
        config_from_hf(QWEN15_MOE | {"use_sliding_window": True})
    with pytest.raises(ModelLoadError, match="shared_expert_intermediate_size"):
        config_from_hf({k: v for k, v in QWEN15_MOE.items() if k != "shared_expert_intermediate_size"})


def test_exaone_3_5_reads_its_own_key_names_as_llama_s():
    # the shape of LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct's config.json, in its own key names
    exaone = {"activation_function": "silu", "architectures": ["ExaoneForCausalLM"], "bos_token_id": 1,
              "eos_token_id": 361, "head_dim": 80, "hidden_size": 2560, "intermediate_size": 7168,
              "layer_norm_epsilon": 1e-05, "max_position_embeddings": 32768, "model_type": "exaone",
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_layers": 30, "pad_token_id": 0,
              "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 1000000.0, "tie_word_embeddings": True, "vocab_size": 102400}
    cfg = config_from_hf(exaone)
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim) == \
        ("exaone", 30, 2560, 8, 80)
    assert cfg.rms_norm_eps == 1e-5 and cfg.tie_word_embeddings and cfg.rope_scaling.rope_type == "llama3"
    assert cfg.eos_token_ids == (361,)
    with pytest.raises(ModelLoadError, match="gelu"):
        config_from_hf(exaone | {"activation_function": "gelu"})


def test_dots_llm1_has_deepseek_v3_experts_after_a_dense_layer_and_no_window_below_max_window_layers():
    # dots.llm1's shape (142B-A14B: 128 experts, 6 a token, 2 shared, the first layer dense), windows from layer 62
    dots = {"architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "hidden_size": 4096,
            "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 62,
            "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "n_routed_experts": 128,
            "num_experts_per_tok": 6, "n_shared_experts": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5, "max_window_layers": 62, "sliding_window": 4096,
            "max_position_embeddings": 32768, "vocab_size": 152064}
    cfg = config_from_hf(dots)
    assert (cfg.architecture, cfg.layer_windows, cfg.qk_norm, cfg.qkv_bias) == ("dots1", (), True, False)
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.sparse_layers, moe.shared_expert_intermediate_size) == \
        (128, 6, tuple(range(1, 62)), 2 * 1408)
    assert moe.sigmoid_routing and moe.norm_topk_prob and moe.routed_scaling == 2.5
    assert config_from_hf(dots | {"max_window_layers": 60}).layer_windows[59:] == (None, 4096, 4096)
