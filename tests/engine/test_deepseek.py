"""Latent attention (DeepSeek-V2/V3, Kimi K2 and K2.5, GLM-4.7-Flash) beyond the family tests' float32 parity
(tests/engine/test_model_families.py): the published configs read into one cached head of rope key + latent and
transformers' softmax scale; each part of the attention (yarn's mscale on the scores, rope on adjacent pairs, the
latent norm) and of V2's routing (the group limit, the scaling) is what makes the logits transformers'; V2's router
picks transformers' experts with transformers' weights; the cache holds one row a token; what is not served is
refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.model.config import MoEConfig
from services.engine.model.mla_decoder import LatentAttentionDecoderModel
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights
from tests.engine.router_reference import assert_routes_as
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# the shape of deepseek-ai/DeepSeek-V3's config.json (its quantization_config aside: see test_fp8_checkpoints.py)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280,
}
# deepseek-ai/DeepSeek-V2-Lite's
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "tie_word_embeddings": False,
    "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400,
}
# a config of GLM-4.7-Flash's kind (values wider than the keys' nope part, GLM's routing, mlp_layer_types absent)
GLM_47_FLASH = {
    "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "hidden_size": 2048,
    "intermediate_size": 10240, "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
    "q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "n_routed_experts": 64, "num_experts_per_tok": 4, "n_shared_experts": 1, "moe_intermediate_size": 1536,
    "routed_scaling_factor": 1.8, "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "vocab_size": 154880,
    "max_position_embeddings": 202752, "rope_theta": 1000000, "rms_norm_eps": 1e-05, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False, "eos_token_id": [154820, 154827, 154829],
}


def _transformers_scale(cfg: dict) -> float:
    """The softmax scale transformers' attention of this config uses (``yarn_apply_mscale``)."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    return yarn_apply_mscale(config.rope_parameters, (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5)


def test_the_published_configs_read_one_cached_head_of_rope_key_and_latent():
    v3 = config_from_hf(DEEPSEEK_V3)
    assert (v3.architecture, v3.num_layers, v3.num_heads, v3.num_kv_heads, v3.head_dim, v3.rotary_dim) == \
        ("deepseek", 61, 128, 1, 576, 64)
    assert v3.rope_interleaved and v3.mla.q_lora_rank == 1536 and v3.mla.qk_head_dim == 192
    assert v3.kv_bytes_per_token(2) == 2 * 61 * 576 * 2  # the row, and again as the V half
    moe = v3.moe
    assert (moe.num_experts, moe.top_k, moe.sparse_layers[0], moe.expert_groups, moe.top_groups) == (256, 8, 3, 8, 4)
    assert moe.sigmoid_routing and moe.routed_scaling == 2.5 and moe.shared_expert_intermediate_size == 2048
    assert v3.multipliers.attention == pytest.approx(_transformers_scale(DEEPSEEK_V3), rel=1e-12)
    kimi = config_from_hf(DEEPSEEK_V3 | {"model_type": "kimi_k2", "n_routed_experts": 384, "n_group": 1,
                                         "topk_group": 1, "routed_scaling_factor": 2.827})
    assert kimi.architecture == "deepseek" and kimi.moe.num_experts == 384
    # Kimi K2.5 / K2.6: the vision-language wrapper, its text model Kimi K2's (untied as released; the class ties)
    k25 = config_from_hf({"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
                          "tie_word_embeddings": False, "vision_config": {"hidden_size": 1152},
                          "text_config": DEEPSEEK_V3 | {"model_type": "kimi_k2", "n_routed_experts": 384,
                                                        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827,
                                                        "tie_word_embeddings": False}})
    assert dataclasses.replace(k25, tie_word_embeddings=False) == kimi and not k25.tie_word_embeddings
    assert config_from_hf({"model_type": "kimi_k25", "text_config": DEEPSEEK_V3}).tie_word_embeddings  # its default
    lite = config_from_hf(DEEPSEEK_V2_LITE)
    assert lite.mla.q_lora_rank is None and (lite.num_heads, lite.head_dim) == (16, 576)
    assert lite.moe.group_limited_softmax and not lite.moe.sigmoid_routing and not lite.moe.norm_topk_prob
    assert (lite.moe.top_k, lite.moe.shared_expert_intermediate_size) == (6, 2816)
    assert lite.multipliers.attention == pytest.approx(_transformers_scale(DEEPSEEK_V2_LITE), rel=1e-12)
    flash = config_from_hf(GLM_47_FLASH)
    assert (flash.architecture, flash.head_dim, flash.mla.v_head_dim, flash.mla.qk_nope_head_dim) == \
        ("glm4_moe_lite", 576, 256, 192)
    assert flash.moe.sparse_layers == tuple(range(1, 47)) and flash.moe.routed_scaling == 1.8
    assert flash.multipliers.attention == pytest.approx(256**-0.5) and flash.rms_norm_eps == 1e-5
    # keys a config leaves out take the config class's defaults (shared and routed experts, GLM's eps)
    bare = config_from_hf({k: v for k, v in GLM_47_FLASH.items()
                           if k not in ("n_shared_experts", "n_routed_experts", "rms_norm_eps")})
    assert (bare.moe.num_experts, bare.moe.shared_expert_intermediate_size, bare.rms_norm_eps) == (64, 1536, 1e-5)
    v3_bare = config_from_hf({k: v for k, v in DEEPSEEK_V3.items()
                              if k not in ("n_shared_experts", "n_routed_experts")})
    assert (v3_bare.moe.num_experts, v3_bare.moe.shared_expert_intermediate_size) == (256, 2048)


@pytest.mark.parametrize(("config", "change", "named"), [
    (DEEPSEEK_V3, {"attention_bias": True}, "attention_bias"),
    (DEEPSEEK_V3, {"moe_layer_freq": 2}, "moe_layer_freq 2"),
    (DEEPSEEK_V3, {"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    (DEEPSEEK_V3, {"topk_method": "greedy"}, "topk_method 'greedy'"),
    (DEEPSEEK_V3, {"kv_lora_rank": None}, "kv_lora_rank"),
    (DEEPSEEK_V2_LITE, {"topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
    (DEEPSEEK_V2_LITE, {"norm_topk_prob": True}, "norm_topk_prob true"),
    (DEEPSEEK_V2_LITE, {"topk_method": "group_limited_greedy", "n_group": 3}, "n_group 3 must divide"),
    (GLM_47_FLASH, {"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types must list 47"),
    ({"model_type": "kimi_k25"}, {"text_config": DEEPSEEK_V2_LITE}, "kimi_k25: a text model of type 'deepseek_v2'"),
])
def test_what_is_not_served_is_refused_by_name(config, change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(config | change)


@pytest.fixture(scope="module")
def v3(family_dir):
    path = family_dir("deepseek-v3")
    return path, load_weights(path), load_reference(path)


def _logits(weights, config=None, tensors=None) -> torch.Tensor:
    model = LatentAttentionDecoderModel(config or weights.config, tensors or weights.tensors, torch.float32)
    return pdserve_logits(model, _prompts()["long"][:64])


def test_each_part_of_the_attention_is_what_makes_it_exact(v3):
    """A prompt's logits equal transformers'; yarn's mscale left off the scores, rope on halves instead of pairs,
    or the latent's norm left out are far from them."""
    _, weights, reference = v3
    expected = hf_logits(reference, _prompts()["long"][:64])
    assert torch.allclose(_logits(weights), expected, atol=1e-4, rtol=1e-4)
    config, mla = weights.config, weights.config.mla
    for wrong in (dataclasses.replace(config, multipliers=dataclasses.replace(config.multipliers,
                                                                               attention=mla.qk_head_dim**-0.5)),
                  dataclasses.replace(config, rope_interleaved=False)):
        assert (_logits(weights, wrong) - expected).abs().max() > 1e-2, wrong
    unnormed = {n: torch.ones_like(t) if n.endswith("kv_a_layernorm.weight") else t for n, t in weights.tensors.items()}
    assert (_logits(weights, tensors=unnormed) - expected).abs().max() > 1e-2


def test_v2_s_group_limit_and_scaling_are_what_make_it_exact(family_dir):
    path = family_dir("deepseek-v2")
    weights, reference = load_weights(path), load_reference(path)
    expected = hf_logits(reference, _prompts()["long"][:64])
    assert torch.allclose(_logits(weights), expected, atol=1e-4, rtol=1e-4)
    moe = weights.config.moe
    for wrong in (dataclasses.replace(moe, top_groups=moe.expert_groups), dataclasses.replace(moe, routed_scaling=1.0)):
        assert (_logits(weights, dataclasses.replace(weights.config, moe=wrong)) - expected).abs().max() > 1e-2, wrong


@pytest.mark.parametrize(("method", "groups", "top_groups"), [("greedy", 1, 1), ("group_limited_greedy", 4, 2)])
def test_v2_s_router_picks_transformers_experts_and_weights(method, groups, top_groups):
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    hf = DeepseekV2TopkRouter(DeepseekV2Config(hidden_size=32, n_routed_experts=16, num_experts_per_tok=3,
                                               topk_method=method, n_group=groups, topk_group=top_groups,
                                               routed_scaling_factor=16.0))
    assert_routes_as(hf, MoEConfig(num_experts=16, top_k=3, intermediate_size=8, norm_topk_prob=False,
                                   sparse_layers=(0,), group_limited_softmax=True, expert_groups=groups,
                                   top_groups=top_groups, routed_scaling=16.0), seed=5)


def test_the_cache_holds_one_row_a_token_and_the_deterministic_mode_is_refused(v3):
    path, _, _ = v3
    engine = LLMEngine.from_config(EngineConfig(model_path=str(path), dtype="float32", num_kv_blocks=8))
    spec = engine.kv_layout_spec()
    assert (spec.num_kv_heads, spec.head_dim) == (1, 16 + 32)
    assert spec.bytes_per_block == spec.num_layers * 2 * spec.block_size * 48 * 4
    with pytest.raises(ModelLoadError, match="deterministic mode does not serve latent attention"):
        LLMEngine.from_config(EngineConfig(model_path=str(path), dtype="float32", num_kv_blocks=8,
                                           deterministic=True))
