"""Cohere's Command R+ (its per-head q/k norms) and Cohere 2's Command R7B / Command A (tiny twins of
tests/engine/tiny_families.py): the logits transformers gives, scale included (greedy tokens cannot see
``logit_scale``); the config (Cohere 2's sliding layers rotate, its full ones do not); what it cannot serve refused
by name."""

from __future__ import annotations

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from services.engine.weights.model_config_reader import read_hf_config
from tests.engine.tiny_gguf import assert_checkpoint_logits

IDS = [(i * 7919) % 49000 + 17 for i in range(40)]  # past Cohere 2's window of 24


@pytest.mark.parametrize("name", ["cohere", "cohere-2"])
def test_the_logits_are_transformers_scale_included(family_dir, name):
    weights = assert_checkpoint_logits(family_dir(name), IDS)
    assert weights.config.multipliers.logits_scale == {"cohere": 0.0625, "cohere-2": 0.25}[name]


def test_cohere_2_s_sliding_layers_rotate_and_its_full_ones_do_not(family_dir):
    cfg = config_from_hf(read_hf_config(family_dir("cohere-2")))
    assert cfg.architecture == "cohere" and cfg.rope_interleaved and cfg.tie_word_embeddings
    assert cfg.layer_windows == (24, None, 24) and cfg.nope_layers == (1,)
    command_r_plus = config_from_hf(read_hf_config(family_dir("cohere")))
    assert command_r_plus.layer_windows == () and command_r_plus.nope_layers == () and command_r_plus.qk_norm
    assert command_r_plus.rms_norm_eps == 1e-5 and not cfg.qk_norm


@pytest.mark.parametrize(("change", "message"), [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
])
def test_what_it_cannot_serve_is_refused_by_name(family_dir, change, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(read_hf_config(family_dir("cohere")) | change)
