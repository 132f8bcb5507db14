"""EXAONE 4.0 (tiny twin of tests/engine/tiny_families.py): OLMo 2's layer with per-head q/k norms, sliding layers with
rope around global ones without (the 32B's kind), or every layer global with rope (the 1.2B's): transformers'
logits; the config as transformers reads it."""

from __future__ import annotations

import pytest

from services.engine.model.registry import config_from_hf
from services.engine.weights.model_config_reader import read_hf_config
from tests.engine.tiny_gguf import assert_checkpoint_logits, tiny_hf

IDS = [(i * 7919) % 49000 + 17 for i in range(40)]  # past the window of 24


def test_the_logits_are_transformers(family_dir):
    assert_checkpoint_logits(family_dir("exaone4"), IDS)


def test_the_32b_s_global_layers_are_unrotated_and_the_1_2b_s_all_rotate(family_dir, tmp_path):
    cfg = config_from_hf(read_hf_config(family_dir("exaone4")))
    assert (cfg.layer_windows, cfg.nope_layers, cfg.qk_norm) == ((24, None, 24), (1,), True)
    small = tiny_hf("exaone4", head_dim=16, sliding_window=None, layer_types=["full_attention"] * 2,
                    tie_word_embeddings=True)
    small.save_pretrained(str(tmp_path))
    weights = assert_checkpoint_logits(tmp_path, [(i * 37 + 5) % 96 for i in range(30)])
    assert (weights.config.layer_windows, weights.config.nope_layers) == ((), ())


def test_layer_types_of_another_length_are_refused_naming_the_family(family_dir):
    from services.engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="exaone4"):
        config_from_hf(read_hf_config(family_dir("exaone4")) | {"layer_types": ["sliding_attention", "full_attention"]})
