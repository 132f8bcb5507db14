"""Llama 4's configs read as transformers builds them (Scout's, transformers' defaults; Maverick's kind), served at
their whole context with chunked attention on the rotated layers; the released wrapper's checkpoint served exactly
(its vision model not read); the query temperature at the positions it steps; refusals by name. The family test
serves the tiny text checkpoint exactly across chunks of 48 (tests/engine/test_model_families.py: ``llama4``)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.llama4 import llama4_tensor_name
from services.engine.model.llama4_decoder import Llama4DecoderModel
from services.engine.model.registry import config_from_hf, model_class
from services.engine.sampling_params import SamplingParams
from tests.engine.test_model_families import _engine, _prompts, assert_matches
from tests.engine.tiny_families import SHAPE, greedy_full_forward


def _scout_text() -> dict:
    from transformers import Llama4TextConfig

    return Llama4TextConfig().to_dict()


def test_scout_reads_experts_on_every_layer_nope_layers_and_chunks_on_the_rotated_ones():
    cfg = config_from_hf({"model_type": "llama4", "text_config": _scout_text(), "vision_config": {}})
    assert cfg.architecture == "llama4" and model_class("llama4") is Llama4DecoderModel
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (48, 5120, 40, 8, 128)
    assert cfg.nope_layers == tuple(range(3, 48, 4)) and cfg.rope_interleaved and cfg.rope_theta == 500000.0
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_intermediate_size) == (16, 1, 8192,
                                                                                                         8192)
    assert moe.sparse_layers == tuple(range(48)) and not moe.shared_expert_gated and not moe.norm_topk_prob
    assert cfg.intermediate_size == 16384  # intermediate_size_mlp: the dense layers' (none in Scout)
    assert (cfg.llama4.qk_l2_norm, cfg.llama4.temperature_scale, cfg.llama4.temperature_floor) == (True, 0.1, 8192)
    assert cfg.max_position == _scout_text()["max_position_embeddings"] > 8192  # served whole: chunks past 8192
    assert cfg.attention_chunk == 8192 and cfg.chunked_layers == tuple(i for i in range(48) if i not in cfg.nope_layers)
    assert not cfg.tie_word_embeddings


def _released_scout_text() -> dict:
    """Scout's text config with the keys its release writes (transformers 4.51's: ``attn_temperature_tuning`` 4,
    ``rope_scaling``, the cache and compressor keys)."""
    return {"attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0, "attn_scale": 0.1,
            "attn_temperature_tuning": 4, "bos_token_id": 200000, "cache_implementation": "hybrid",
            "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "for_llm_compressor": False,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
            "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "max_position_embeddings": 10485760, "model_type": "llama4_text", "moe_layers": list(range(48)),
            "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)], "num_attention_heads": 40,
            "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
            "output_router_logits": False, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
            "torch_dtype": "bfloat16", "use_qk_norm": True, "vocab_size": 202048}


def test_the_released_scout_config_reads_its_temperature_flag_as_4_51_did():
    cfg = config_from_hf({"model_type": "llama4", "text_config": _released_scout_text(), "vision_config": {}})
    assert cfg.llama4.temperature_scale == 0.1 and cfg.max_position == 10485760 and cfg.attention_chunk == 8192
    assert (cfg.rope_scaling.rope_type, cfg.rope_scaling.factor, cfg.rope_scaling.original_max_position) == (
        "llama3", 16.0, 8192)
    assert cfg.eos_token_ids == (200001, 200007, 200008)
    assert config_from_hf(_released_scout_text() | {"attn_temperature_tuning": 0}).llama4.temperature_scale == 0.0


def test_maverick_kind_interleaves_dense_layers_without_qk_norms():
    cfg = config_from_hf(_scout_text() | {"num_local_experts": 128, "interleave_moe_layer_step": 2,
                                          "use_qk_norm": False, "moe_layers": None})
    assert cfg.moe.num_experts == 128 and cfg.moe.sparse_layers == tuple(range(1, 48, 2))
    assert not cfg.llama4.qk_l2_norm


def test_the_query_temperature_steps_where_transformers_does():
    cfg = config_from_hf(_scout_text())
    positions = torch.tensor([0, 8190, 8191, 8192, 16383])
    scale = Llama4DecoderModel._query_scale(SimpleNamespace(config=cfg), positions, torch.bfloat16)
    # transformers' Llama4TextAttention: log1p(floor((p + 1) / floor_scale)) * attn_scale + 1, in float32
    expected = torch.log1p(torch.floor((positions.float() + 1.0) / 8192)) * 0.1 + 1.0
    assert scale.dtype == torch.float32 and torch.equal(scale.flatten(), expected)
    assert scale.flatten()[1] == 1.0 and scale.flatten()[2] > 1.0  # position 8191 is the first past the floor


def test_the_vision_model_is_not_read_and_the_feed_forward_is_the_mlp():
    assert llama4_tensor_name("language_model.model.layers.0.feed_forward.router.weight") == \
        "model.layers.0.mlp.gate.weight"
    assert llama4_tensor_name("language_model.model.layers.1.feed_forward.experts.gate_up_proj") == \
        "model.layers.1.mlp.experts.gate_up_proj"
    assert llama4_tensor_name("model.language_model.layers.2.feed_forward.shared_expert.down_proj.weight") == \
        "model.layers.2.mlp.shared_expert.down_proj.weight"
    assert llama4_tensor_name("language_model.lm_head.weight") == "lm_head.weight"
    for name in ("vision_model.model.layers.0.mlp.fc1.weight", "multi_modal_projector.linear_1.weight",
                 "model.vision_model.patch_embedding.linear.weight"):
        assert llama4_tensor_name(name) is None, name


def test_the_released_wrapper_is_served_as_its_text_model(tmp_path, bundled_tokenizer):
    """Llama4ForConditionalGeneration, written by transformers, gives its language model's greedy tokens (the
    wrapper's own forward is not called: transformers 5.24's fails on text-only input); its experts' gate/up tensors
    are square here ([E, 64, 2 · 32]), read transposed all the same."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    vocab = len(bundled_tokenizer.hf)
    text = SHAPE | dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, head_dim=16, num_hidden_layers=4,
                        num_local_experts=4, num_experts_per_tok=1, intermediate_size=32, intermediate_size_mlp=96,
                        interleave_moe_layer_step=2, floor_scale=64, attention_chunk_size=32)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    torch.manual_seed(5)
    wrapper = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision)).eval()
    wrapper.save_pretrained(str(tmp_path))
    bundled_tokenizer.hf.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama4"
    reference = wrapper.language_model  # a Llama4ForCausalLM: language_model.model.*, language_model.lm_head
    engine = _engine(tmp_path)
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for name, prompt in _prompts().items():
        with torch.inference_mode():
            expected = greedy_full_forward(reference, prompt, 6)
        assert_matches(f"llama4-wrapper/{name}", expected, engine.generate([prompt], sampling)[0].token_ids)


def test_served_within_a_chunk_the_layers_are_full_and_the_rope_tables_that_long():
    cfg = config_from_hf(_released_scout_text())
    within = cfg.served_within(8192)  # no query sees past its chunk: every layer full (decode graphs, one plan)
    assert within.attention_chunk is None and within.chunked_layers == () and within.max_position == 8192
    past = cfg.served_within(8193)
    assert past.attention_chunk == 8192 and past.chunked_layers == cfg.chunked_layers and past.max_position == 8193
    pooled = cfg.served_within(None, kv_tokens=1 << 20)  # 10M positions, a pool of 1M tokens: tables of 1M
    assert (pooled.max_position, pooled.rope_length, pooled.attention_chunk) == (10485760, 1 << 20, 8192)
    assert cfg.served_within(None, kv_tokens=1 << 30).rope_positions is None


def test_the_rope_tables_hold_the_positions_the_kv_pool_can(family_dir):
    engine = _engine(family_dir("llama4"), num_kv_blocks=8)  # 128 tokens of KV; a context of 4096 all the same
    assert engine.max_model_len == 4096 and engine.model.rope.max_position == 128
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    assert len(engine.generate([list(range(5, 125))], sampling)[0].token_ids) == 4  # position 123: the table's last


def test_a_block_size_that_does_not_divide_the_chunk_is_refused_by_name(family_dir):
    with pytest.raises(ValueError, match="chunk of 48 tokens is not a whole number of blocks of 32"):
        _engine(family_dir("llama4"), block_size=32)


@pytest.mark.parametrize(("change", "named"), [
    ({"attention_bias": True}, "attention_bias is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers lists 2 layers, fewer than 48"),
    ({"attention_chunk_size": None, "layer_types": ["chunked_attention"] * 48},
     "chunked_attention layers but attention_chunk_size is null"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(_scout_text() | change)
