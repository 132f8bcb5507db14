"""GPT-NeoX beyond the family test's greedy tokens: the float32 logits of a prompt are transformers', and its q/k/v
regrouped from their head-by-head interleaving, the MLP's own norm in the parallel layer and the exact GELU are what
make them so; what it does not serve is refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.gpt_neox import gpt_neox_tensor_name
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe


def test_the_regrouped_qkv_the_mlp_s_own_norm_and_the_exact_gelu_make_the_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("gpt_neox"), _prompts()["long"][:64])
    config = weights.config
    interleaved = {name.replace(".query_key_value.", ".qkv_proj."): t for name, t in weights.tensors.items()}
    without_mlp_norm = {name: t for name, t in weights.tensors.items() if ".post_attention_layernorm." not in name}
    assert_each_part_matters(logits, expected, {
        "regrouped q/k/v": {"tensors": interleaved},
        "the MLP's own norm": {"config": dataclasses.replace(config, parallel_mlp_norm=False),
                               "tensors": without_mlp_norm}})
    # the tanh GELU is within ~1e-3 of the exact one: it moves the logits less than a part does, but past exactness
    tanh = logits(config=dataclasses.replace(config, mlp_activation="gelu_tanh"))
    assert (tanh - expected).abs().max() > 1e-4, (tanh - expected).abs().max()


def test_the_sequential_kind_and_the_defaults_are_read():
    base = dict(model_type="gpt_neox", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4)
    parallel, sequential = config_from_hf(base), config_from_hf(base | {"use_parallel_residual": False})
    assert parallel.parallel_blocks and parallel.parallel_mlp_norm and parallel.rotary_dim == 4  # a quarter of 16
    assert not sequential.parallel_blocks and not sequential.parallel_mlp_norm
    assert parallel.num_kv_heads == 4 and parallel.mlp_activation == "gelu" and parallel.qkv_bias
    assert config_from_hf(base | {"head_dim": 32}).head_dim == 16  # transformers' attention takes hidden / heads
    with pytest.raises(ModelLoadError, match="hidden_act"):
        config_from_hf(base | {"hidden_act": "relu"})


def test_the_mask_buffers_older_checkpoints_saved_are_not_read():
    """Pythia's and GPT-NeoX-20B's files (saved by transformers 4) hold each layer's causal mask and its fill value,
    which transformers drops on load; the attention's and the MLP's biases are read."""
    assert gpt_neox_tensor_name("gpt_neox.layers.3.attention.bias") is None
    assert gpt_neox_tensor_name("gpt_neox.layers.3.attention.masked_bias") is None
    assert gpt_neox_tensor_name("gpt_neox.layers.3.attention.dense.bias") == "model.layers.3.self_attn.o_proj.bias"
    assert gpt_neox_tensor_name("gpt_neox.layers.3.attention.query_key_value.bias") == \
        "model.layers.3.self_attn.query_key_value.bias"
    assert gpt_neox_tensor_name("embed_out.weight") == "lm_head.weight"
