"""Granite 4.0's config (``granitemoehybrid``) as transformers reads it: rope only where ``position_embedding_type``
is ``rope`` (null, as transformers' default, and ``nope`` rotate nothing), the ``{"__float__": "Infinity"}`` that
``save_pretrained`` writes for ``time_step_limit`` read back as the float, and what pdserve cannot serve refused by
name."""

from __future__ import annotations

import json

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from services.engine.weights.model_config_reader import read_hf_config


@pytest.fixture(scope="module")
def saved(family_dir):
    path = family_dir("granite_hybrid")
    raw = json.loads((path / "config.json").read_text())
    assert raw["time_step_limit"][1] == {"__float__": "Infinity"}  # as transformers writes it
    return path, read_hf_config(path)


def test_the_saved_config_reads_with_its_infinite_time_step_limit(saved):
    _, config = saved
    assert config["time_step_limit"] == [0.0, float("inf")]
    cfg = config_from_hf(config)
    assert cfg.architecture == "granite_hybrid" and cfg.mamba.layers == (0, 2) and cfg.kv_layers == (1,)
    assert cfg.mamba.conv_dim == 128 + 2 * 2 * 16 and cfg.mamba.conv_bias


@pytest.mark.parametrize(("embedding", "rotated"), [("rope", True), ("nope", False), (None, False)])
def test_only_rope_rotates(saved, embedding, rotated):
    _, config = saved
    cfg = config_from_hf(config | {"position_embedding_type": embedding})
    assert cfg.nope_layers == (() if rotated else (1,))


@pytest.mark.parametrize(("change", "message"), [
    ({"position_embedding_type": "alibi"}, "position_embedding_type"),
    ({"layer_types": ["mamba"] * 3}, "no attention layer"),
    ({"time_step_limit": [0.0, 1.0]}, "time_step_limit"),
    ({"mamba_proj_bias": True}, "mamba_proj_bias"),
    ({"mamba_n_groups": 3}, "groups"),
])
def test_what_it_cannot_serve_is_refused_by_name(saved, change, message):
    _, config = saved
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(config | change)


def test_the_attention_only_models_keep_no_state(family_dir):
    cfg = config_from_hf(read_hf_config(family_dir("granite_hybrid-attention")))
    assert cfg.mamba is None and not cfg.has_recurrent_state and cfg.kv_layers == (0, 1, 2)
