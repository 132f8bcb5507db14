"""The shared decoder's second rope (``ModelConfig.local_rope_layers``, :mod:`services.engine.model.typed_ropes`)
beyond the family test's greedy parity: Mellum's and Granite SWA's tiny checkpoints give transformers' logits and their
local layers' own base is what makes them so; Granite SWA's per-layer bases map onto the two ropes (a third base, or
two under a scaling, refused by name)."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe


@pytest.mark.parametrize("name", ["mellum", "granite_swa"])
def test_the_local_layers_own_rope_is_what_makes_the_logits_transformers(name, family_dir):
    weights, expected, logits = exactness_probe(family_dir(name), _prompts()["long"])
    config = weights.config
    assert config.local_rope_layers and config.local_rope_theta != config.rope_theta
    assert_each_part_matters(logits, expected, {
        "the local base": {"config": dataclasses.replace(config, local_rope_theta=config.rope_theta)}})


def _granite_swa(thetas: list[float], **extra) -> object:
    return config_from_hf({"model_type": "granite_swa", "num_hidden_layers": len(thetas),
                           "layer_types": ["full_attention"] + ["sliding_attention"] * (len(thetas) - 1),
                           "layer_rope_theta": thetas, **extra})


def test_granite_swa_bases_map_onto_the_main_and_local_ropes():
    config = _granite_swa([0, 10000.0, 10000.0, 500000.0])
    assert (config.rope_theta, config.local_rope_theta) == (10000.0, 500000.0)
    assert config.local_rope_layers == (3,) and config.nope_layers == (0,) and config.attention_sinks
    one = _granite_swa([0, 10000.0, 10000.0, 10000.0])
    assert one.local_rope_layers == () and one.local_rope_theta is None and one.nope_layers == (0,)


def test_granite_swa_bases_the_two_ropes_cannot_hold_are_refused_by_name():
    with pytest.raises(ModelLoadError, match=r"granite_swa: layer_rope_theta .*\(at most two bases"):
        _granite_swa([0, 1000.0, 10000.0, 500000.0])
    with pytest.raises(ModelLoadError, match=r"granite_swa: layer_rope_theta .*one under a rope scaling"):
        _granite_swa([0, 10000.0, 10000.0, 500000.0],
                     rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
