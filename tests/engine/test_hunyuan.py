"""Hunyuan dense (tiny twin of tests/engine/tiny_families.py): transformers' logits, with q/k normed after rope and the
NTK-alpha base; a length-following dynamic rope and Hunyuan-Large's cross-layer attention refused by name."""

from __future__ import annotations

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from services.engine.weights.model_config_reader import read_hf_config
from tests.engine.tiny_gguf import assert_checkpoint_logits

IDS = [(i * 7919) % 49000 + 17 for i in range(40)]


def test_the_logits_are_transformers(family_dir):
    assert_checkpoint_logits(family_dir("hunyuan"), IDS)


def test_the_alpha_stretches_the_base_and_the_norms_follow_rope(family_dir):
    cfg = config_from_hf(read_hf_config(family_dir("hunyuan")))
    assert cfg.rope_scaling is None and cfg.rope_theta == pytest.approx(10000.0 * 1000.0 ** (16 / 14))
    assert cfg.qk_norm and cfg.qk_norm_after_rope and not cfg.qk_norm_whole


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "dynamic rope without alpha"),
    ({"use_cla": True, "cla_share_factor": 2}, "use_cla is not supported"),
])
def test_what_it_cannot_serve_is_refused_by_name(family_dir, change, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(read_hf_config(family_dir("hunyuan")) | change)
