"""Nemotron-H's config as its released files write it (``hybrid_override_pattern``: ``M`` Mamba-2, ``*``
attention, ``-`` MLP) and its tensor names (``backbone.``; transformers saves them so too, and the family test
serves such a file exactly); MoE blocks (``E``) refused by name."""

from __future__ import annotations

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.nemotron_h import nemotron_h_tensor_name
from services.engine.model.registry import config_from_hf
from services.engine.weights.model_config_reader import read_hf_config


@pytest.fixture(scope="module")
def released(family_dir):
    config = read_hf_config(family_dir("nemotron_h"))
    config.pop("layers_block_type")
    return config | {"hybrid_override_pattern": "M-*-M"}


def test_the_pattern_names_each_block(released):
    cfg = config_from_hf(released)
    assert cfg.architecture == "nemotron_h" and cfg.num_layers == 5
    assert cfg.mamba.layers == (0, 4) and cfg.mlp_blocks == (1, 3) and cfg.kv_layers == (2,)
    assert cfg.nope_layers == (2,) and cfg.mamba.dt_min == 0.0 and cfg.mamba.conv_bias  # time_step_limit's floor
    assert config_from_hf(released | {"time_step_limit": [0.01, float("inf")]}).mamba.dt_min == 0.01


@pytest.mark.parametrize(("change", "message"), [
    ({"hybrid_override_pattern": "ME*-M"}, "block types"),
    ({"hybrid_override_pattern": "M-M-M"}, "no attention layer"),
    ({"mlp_hidden_act": "silu"}, "activations"),
    ({"residual_in_fp32": True}, "residual_in_fp32"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"time_step_limit": [0.0, 10.0]}, "time_step_limit"),
])
def test_what_it_cannot_serve_is_refused_by_name(released, change, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(released | change)


def test_the_released_tensor_names():
    assert nemotron_h_tensor_name("backbone.embeddings.weight") == "model.embed_tokens.weight"
    assert nemotron_h_tensor_name("backbone.norm_f.weight") == "model.norm.weight"
    assert nemotron_h_tensor_name("backbone.layers.3.norm.weight") == "model.layers.3.input_layernorm.weight"
    assert nemotron_h_tensor_name("backbone.layers.0.mixer.norm.weight") == "model.layers.0.mixer.norm.weight"
    assert nemotron_h_tensor_name("lm_head.weight") == "lm_head.weight"
    assert nemotron_h_tensor_name("mtp.layers.0.norm.weight") is None


def test_the_weights_a_step_reads_are_its_matrices(family_dir):
    """The bandwidth floor's count (``random_llama.weight_bytes``): a Mamba-2 block's projections, an attention
    block's, an MLP block's up and down, and no MLP beside a mixer."""
    from services.engine.random_llama import weight_bytes
    from tests.engine.tiny_families import load_reference

    path = family_dir("nemotron_h")
    model = load_reference(path)
    cfg = config_from_hf(read_hf_config(path))
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # the conv's weight is 3-D: not counted
    assert weight_bytes(cfg, 2) == 2 * (matrices - cfg.vocab_size * cfg.hidden_size)  # the table is gathered


@pytest.mark.parametrize("name", ["nemotron_h", "granite_hybrid", "qwen3_5", "lfm2"])
def test_a_hybrid_config_survives_the_weights_cache_round_trip(family_dir, name):
    """The weights cache keeps a model's config as JSON (``gguf_cache_config``): tuples and the recurrent specs
    come back as they were."""
    import dataclasses
    import json

    from services.engine.weights.gguf_cache_config import config_from_dict

    cfg = config_from_hf(read_hf_config(family_dir(name)))
    assert config_from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg
