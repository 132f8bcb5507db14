"""Pure state-space models (Mamba, Falcon-Mamba, Mamba-2: no attention, no MLP, no KV at all): their configs read as
transformers completes them, refused by name where pdserve would serve them wrong; Falcon-Mamba's weightless inner
norms and the float32 residual stream are what make the logits transformers'; an engine of such a model counts tokens
in blocks of no bytes and gives its whole budget to the states. (Greedy tokens, chunked prefill, checkpoint hits and
preemption by recompute: the family tests; P→D through a real cluster: tests/e2e/test_model_families_cluster.py.)"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.engine import MAX_COUNTING_TOKENS, LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.kv_offload import KVOffload
from services.engine.model.mamba import UNBOUNDED_CONTEXT, state_space_tensor_name
from services.engine.model.registry import config_from_hf, model_class
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe, hf_logits, pdserve_logits

PROMPT = _prompts()["long"][:64]
SHAPE = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2}


def test_mamba_configs_read_transformers_defaults():
    mamba = config_from_hf(SHAPE | {"model_type": "mamba"})
    assert mamba.attention_free and mamba.kv_layers == () and mamba.residual_in_float32 and mamba.tie_word_embeddings
    spec = mamba.mamba1
    assert (spec.layers, spec.inner, spec.state_size, spec.conv_kernel, spec.dt_rank) == ((0, 1), 128, 16, 4,
                                                                                          math.ceil(64 / 16))
    assert not spec.inner_norms and mamba.rms_norm_eps == 1e-5 and mamba.max_position == UNBOUNDED_CONTEXT
    falcon = config_from_hf(SHAPE | {"model_type": "falcon_mamba"}).mamba1
    assert falcon.inner_norms and not falcon.inner_norm_weights and falcon.inner_norm_eps == 1e-6
    mamba2 = config_from_hf(SHAPE | {"model_type": "mamba2", "num_heads": 8, "head_dim": 16, "n_groups": 2})
    assert mamba2.attention_free and mamba2.residual_in_float32 and not mamba2.tie_word_embeddings
    assert (mamba2.mamba.heads, mamba2.mamba.head_dim, mamba2.mamba.groups, mamba2.mamba.state_size) == (8, 16, 2, 128)
    with pytest.raises(ModelLoadError, match="a mixer-only model's every layer is a recurrent mixer"):
        dataclasses.replace(mamba, mamba1=dataclasses.replace(mamba.mamba1, layers=(0,)))
    with pytest.raises(ModelLoadError, match="no attention layer: at least one is needed"):
        dataclasses.replace(mamba, mixer_only=False)  # (a hybrid's layers all recurrent: Qwen3.5's, say)


# Mamba-Codestral-7B-v0.1's config.json as published (written by transformers 4.44's conversion)
CODESTRAL = {"architectures": ["Mamba2ForCausalLM"], "bos_token_id": 0, "chunk_size": 256, "conv_kernel": 4,
             "eos_token_id": 0, "expand": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 4096,
             "initializer_range": 0.1, "intermediate_size": 8192, "layer_norm_epsilon": 1e-05, "model_type": "mamba2",
             "n_groups": 8, "norm_before_gate": True, "num_heads": 128, "num_hidden_layers": 64, "pad_token_id": 0,
             "rescale_prenorm_residual": False, "residual_in_fp32": True, "rms_norm": True, "state_size": 128,
             "tie_word_embeddings": False, "time_step_floor": 0.0001, "time_step_init_scheme": "random",
             "time_step_limit": [0.0, float("inf")], "time_step_max": 0.1, "time_step_min": 0.001,
             "time_step_rank": 256, "time_step_scale": 1.0, "torch_dtype": "bfloat16", "use_bias": False,
             "use_cache": True, "use_conv_bias": True, "vocab_size": 32768}


def test_mamba_codestrals_published_config_reads_as_transformers_serves_it():
    """Its ``norm_before_gate: true`` is ignored, as transformers (and every runtime) ignores it; ~272 MB of state per
    sequence in bf16, which is what ``kv_cache_gib`` holds for it."""
    config = config_from_hf(CODESTRAL)
    spec = config.mamba
    assert config.mixer_only and config.residual_in_float32 and not config.tie_word_embeddings
    assert (spec.heads, spec.head_dim, spec.groups, spec.state_size, config.num_layers) == (128, 64, 8, 128, 64)
    assert spec.state_bytes(2) == 64 * ((8192 + 2 * 8 * 128) * 3 * 2 + 128 * 128 * 64 * 4)


@pytest.mark.parametrize(("change", "message"), [
    ({"use_bias": True}, "mamba2: use_bias is not supported"),
    ({"hidden_act": "gelu"}, "mamba2: hidden_act 'gelu' is not supported"),
    ({"time_step_limit": [0.0, 0.1]}, r"mamba2: time_step_limit \[0.0, 0.1\] is not supported"),
    ({"rms_norm": False}, "mamba2: rms_norm false is not supported"),
    ({"head_dim": 8}, r"(?s)mamba2: config.json is not a Mamba2Config .*must equal num_heads \* head_dim"),
])
def test_a_mamba2_config_pdserve_would_serve_wrong_is_refused_by_name(change, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(SHAPE | {"model_type": "mamba2", "num_heads": 8, "head_dim": 16, "n_groups": 2} | change)


def test_a_mamba_config_with_projection_biases_is_refused_by_name():
    with pytest.raises(ModelLoadError, match="falcon_mamba: use_bias is not supported"):
        config_from_hf(SHAPE | {"model_type": "falcon_mamba", "use_bias": True})


def test_the_released_names_are_read():
    """transformers' ``backbone.*``, the original ``backbone.embedding``, Mamba-Codestral's ``model.backbone.*`` and
    ``model.lm_head``; a layer's norm is its input norm, its mixer's own grouped norm stays the mixer's."""
    assert [state_space_tensor_name(n) for n in (
        "backbone.embeddings.weight", "backbone.embedding.weight", "model.backbone.norm_f.weight",
        "backbone.layers.3.norm.weight", "backbone.layers.3.mixer.norm.weight", "model.lm_head.weight",
        "lm_head.weight", "backbone.layers.0.mixer.dt_proj.bias")] == [
        "model.embed_tokens.weight", "model.embed_tokens.weight", "model.norm.weight",
        "model.layers.3.input_layernorm.weight", "model.layers.3.mamba.norm.weight", "lm_head.weight",
        "lm_head.weight", "model.layers.0.mamba.dt_proj.bias"]


def test_falcon_mambas_weightless_inner_norms_make_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("mamba-falcon"), PROMPT)
    config = weights.config
    assert not any("layernorm" in name and ".mamba." in name for name in weights.tensors)  # weightless, as released
    assert_each_part_matters(logits, expected, {
        "inner norms": {"config": dataclasses.replace(config, mamba1=dataclasses.replace(config.mamba1,
                                                                                          inner_norms=False))},
        "their epsilon": {"config": dataclasses.replace(config, mamba1=dataclasses.replace(config.mamba1,
                                                                                            inner_norm_eps=None))}})


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_the_float32_residual_stream_brings_bf16_logits_to_transformers(name, family_dir):
    """transformers keeps these models' residual stream in float32 (``residual_in_fp32``); in bf16, pdserve's logits
    with it are closer to transformers' than with a bf16 stream (on average over the prompt's 64 rows: ~10-15% here,
    where the kernels' other roundings, the same either way, dominate three layers' worth of residual)."""
    from transformers import AutoModelForCausalLM

    path = family_dir(name)
    weights = load_weights(path)
    reference = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    expected = hf_logits(reference, PROMPT)
    model = model_class(weights.config.architecture)

    def gap(config) -> float:
        return (pdserve_logits(model(config, dict(weights.tensors), torch.bfloat16), PROMPT) - expected).abs().mean()

    kept, rounded = gap(weights.config), gap(dataclasses.replace(weights.config, residual_in_float32=False))
    assert kept < rounded, (kept, rounded)


def test_an_engine_without_kv_counts_tokens_in_blocks_of_no_bytes(family_dir):
    """Its pool holds no bytes: blocks enough for max_num_seqs sequences of max_model_len (at most MAX_COUNTING_TOKENS
    of them), the budget the states'; a preempted request's state is not kept (recomputed)."""
    engine = LLMEngine.from_config(EngineConfig(model_path=str(family_dir("mamba2")), dtype="float32",
                                                max_model_len=1000, max_num_seqs=4))
    assert engine.runner.kv_cache_bytes == 0 and engine.kv_layout_spec().bytes_per_block == 0
    assert engine.kv.num_blocks == 4 * math.ceil(1000 / 16) and engine.max_model_len == 1000
    assert not engine.offload.claim("victim", 3)  # (0 + 0 bytes fit a budget of 0: the offload is off all the same)
    stats = engine.stats()  # the memory is the states': slots and checkpoints (NodeStatus.state_bytes_total)
    state = engine.model.config.recurrent.state_bytes(4)  # (float32 here)
    assert stats.kv_bytes_total == 0 and stats.state_bytes_total == (4 + stats.state_checkpoints_total) * state
    unbounded = LLMEngine.from_config(EngineConfig(model_path=str(family_dir("mamba2")), dtype="float32"))
    assert unbounded.kv.num_blocks * 16 == MAX_COUNTING_TOKENS and unbounded.max_model_len == UNBOUNDED_CONTEXT
    with pytest.raises(ValueError, match="does not hold the recurrent states"):
        LLMEngine.from_config(EngineConfig(model_path=str(family_dir("mamba2")), dtype="float32", kv_cache_gib=1e-5))
    assert KVOffload(0, 2**20, None).claim("victim", 3)  # (a host budget takes blocks of no bytes: the engine's is 0)
