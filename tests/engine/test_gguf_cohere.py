"""llama.cpp's ``command-r`` (Command R, R+, Aya) and ``cohere2`` (Command R7B, Command A) GGUF files, written from
tiny transformers models the way its converter writes them (``attention.layer_norm_epsilon``, ``logit_scale``, q/k
rows as they are, the head tied; Cohere 2's ``attention.sliding_window`` and no pattern, llama.cpp's being every fourth
layer full), give the twin's float32 logits, their config the one ``config.json`` gives (torch-free alike)."""

from __future__ import annotations

import re

import pytest

from services.engine.errors import ModelLoadError
from services.engine.weights import load_model_config
from tests.engine.tiny_gguf import F32, Q8_0, all_f32, read_as_the_twin, tiny_hf, write_gguf

IDS = [(i * 37 + 5) % 96 for i in range(40)]  # past the window of 24
COMMAND_R_PLUS = dict(model_type="cohere", logit_scale=0.0625, layer_norm_eps=1e-5, use_qk_norm=True,
                      tie_word_embeddings=True)
COMMAND_A = dict(model_type="cohere2", num_hidden_layers=4, logit_scale=0.25, layer_norm_eps=1e-5, sliding_window=24,
                 layer_types=["sliding_attention"] * 3 + ["full_attention"], tie_word_embeddings=True)


def _keys(cfg) -> dict:
    keys = {"attention.layer_norm_rms_epsilon": None, "attention.layer_norm_epsilon": float(cfg.layer_norm_eps),
            "logit_scale": float(cfg.logit_scale)}
    if cfg.model_type == "cohere2":
        keys["attention.sliding_window"] = cfg.sliding_window
    return keys


def _q8_attention(name: str):
    return Q8_0 if name.endswith(("attn_q.weight", "ffn_up.weight")) else F32


@pytest.mark.parametrize("quant", [all_f32, _q8_attention], ids=["f32", "q8_0"])
@pytest.mark.parametrize("spec", [COMMAND_R_PLUS, COMMAND_A], ids=["command-r-plus", "command-a"])
def test_a_cohere_file_gives_transformers_logits(tmp_path, spec, quant):
    model = tiny_hf(**spec)
    path = write_gguf(model, tmp_path / "cohere.gguf", quant, metadata=_keys(model.config))
    cfg = read_as_the_twin(path, model, IDS)
    assert cfg.multipliers.logits_scale == spec["logit_scale"] and cfg.qk_norm == (spec["model_type"] == "cohere")


def test_command_a_s_pattern_is_llama_cpp_s_and_the_keys_it_needs_are_named(tmp_path):
    model = tiny_hf(**COMMAND_A)
    cfg = load_model_config(write_gguf(model, tmp_path / "a.gguf", metadata=_keys(model.config)))
    assert cfg.layer_windows == (24, 24, 24, None) and cfg.nope_layers == (3,) and cfg.rope_interleaved
    marked = _keys(model.config) | {"attention.sliding_window_pattern": [True, False, True, False]}
    assert load_model_config(write_gguf(model, tmp_path / "p.gguf", metadata=marked)).layer_windows == \
        (24, None, 24, None)  # a pattern the file names (llama.cpp reads one where it is there)
    for key in ("attention.layer_norm_epsilon", "logit_scale"):  # llama.cpp requires both
        keys = _keys(model.config) | {key: None}
        with pytest.raises(ModelLoadError, match=re.escape(f"lacks cohere2.{key}")):
            load_model_config(write_gguf(model, tmp_path / f"no-{key}.gguf", metadata=keys))
    no_scale = load_model_config(write_gguf(model, tmp_path / "zero.gguf", metadata=_keys(model.config) | {
        "logit_scale": 0.0}))
    assert no_scale.multipliers.logits_scale == 1.0  # 0: none, as llama.cpp skips it
