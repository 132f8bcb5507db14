"""A checkpoint's generation_config.json fills the sampling settings a request leaves unset (vLLM's
``--generation-config auto``); what a request sets is kept; a bad file is refused naming it."""

from __future__ import annotations

import json

import pytest

from services.common.sampling_convert import SamplingFields
from services.engine.errors import ModelLoadError
from services.engine.generation_defaults import generation_defaults


def _dir(tmp_path, config):
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_sampling_fields_of_the_file_become_defaults(tmp_path):
    path = _dir(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                           "repetition_penalty": 1.05, "eos_token_id": [1, 2], "max_new_tokens": 9})
    assert generation_defaults(path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}


def test_do_sample_false_means_greedy(tmp_path):
    assert generation_defaults(_dir(tmp_path, {"do_sample": False, "top_p": 0.9})) == {"top_p": 0.9,
                                                                                        "temperature": 0.0}


def test_no_file_and_gguf_have_none(tmp_path, bundled_model_path):
    assert generation_defaults(tmp_path) == {}
    assert generation_defaults(bundled_model_path) == {}


def test_a_bad_file_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match=r"generation_config\.json: temperature must be a number"):
        generation_defaults(_dir(tmp_path, {"temperature": "hot"}))


def test_unset_fields_take_the_defaults_and_set_ones_are_kept():
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    resolved = SamplingFields(top_p=0.5).with_defaults(defaults).resolve(default_seed=1)
    assert (resolved.temperature, resolved.top_p, resolved.top_k) == (pytest.approx(0.6), 0.5, 20)
    plain = SamplingFields().resolve(default_seed=1)
    assert (plain.temperature, plain.top_p, plain.top_k) == (1.0, 1.0, 0)
