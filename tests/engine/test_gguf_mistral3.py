"""Ministral 3 / Devstral 2 GGUF files (llama.cpp's ``mistral3``), written from tiny transformers ``ministral3`` models
the way its converter writes them (its llama converter's subclass: q/k rows permuted; yarn's ``rope.scaling.*`` with
``yarn_log_multiplier`` the checkpoint's ``mscale_all_dim``; ``attention.temperature_scale`` its
``llama_4_scaling_beta``), load into the decoder whose float32 logits equal the HF twin's, the query temperature
stepping within the prompt (the yarn's original context 16 here); the config equals the one read from the model's
``config.json``, torch-free alike."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from services.engine.weights.gguf_loader import unpermute_rope_rows
from tests.engine.tiny_gguf import (
    F32,
    Q8_0,
    _hf_tensors,
    _load_twin,
    add_metadata,
    add_tensor_as,
    all_f32,
    close_writer,
    llama_permute,
    read_as_the_twin,
    tiny_hf,
    write_bpe_tokenizer_gguf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
# Ministral 3's settings, its original context 16 of 512 (the temperature steps twice within the 45-token prompt);
# beta_fast and mscale_all_dim not their defaults, so that a misread one shows
MINISTRAL3 = dict(head_dim=16, tie_word_embeddings=False, sliding_window=None,
                  rope_parameters={"rope_type": "yarn", "type": "yarn", "rope_theta": 1000000.0, "factor": 32.0,
                                   "original_max_position_embeddings": 16, "beta_fast": 4.0, "beta_slow": 1.0,
                                   "mscale": 1.0, "mscale_all_dim": 0.7, "llama_4_scaling_beta": 0.1})


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return F32 if name.endswith("norm.weight") else Q8_0


def write_mistral3_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into ``model``."""
    cfg = model.config
    rope = cfg.rope_parameters
    keys = {"context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
            "block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
            "rope.dimension_count": cfg.head_dim, "rope.freq_base": float(rope["rope_theta"]),
            "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "vocab_size": cfg.vocab_size,
            "rope.scaling.type": "yarn", "rope.scaling.factor": float(rope["factor"]),
            "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
            "rope.scaling.yarn_beta_fast": float(rope["beta_fast"]),
            "rope.scaling.yarn_beta_slow": float(rope["beta_slow"]),
            "rope.scaling.yarn_log_multiplier": float(rope["mscale_all_dim"]),
            "attention.temperature_scale": float(rope["llama_4_scaling_beta"])}
    writer = gguf.GGUFWriter(str(path), "mistral3")
    add_metadata(writer, "mistral3", keys, [f"t{i}" for i in range(96)])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MISTRAL3, cfg.num_hidden_layers)
    twin: dict[str, np.ndarray] = {}
    for name, array in _hf_tensors(model).items():
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(name.split(".")[-2])
        if heads:  # rows are quantised alone: the file's rows are the twin's, permuted
            stored = add_tensor_as(writer, gguf_name, llama_permute(array, heads), quant)
            twin[name] = unpermute_rope_rows(stored, heads)
        else:
            twin[name] = add_tensor_as(writer, gguf_name, array, quant)
    close_writer(writer)
    _load_twin(model, twin)
    return path


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
def test_a_mistral3_file_gives_transformers_logits(tmp_path, quant):
    model = tiny_hf("ministral3", vocab_size=96, **MINISTRAL3)
    path = write_mistral3_gguf(model, tmp_path / "tiny-ministral3.gguf", quant)
    cfg = read_as_the_twin(path, model, IDS)
    assert (cfg.query_temperature_beta, cfg.query_temperature_period) == (0.1, 16)


def test_a_mistral3_file_s_tokenizer_reads_as_llama_s(tmp_path, monkeypatch, bundled_tokenizer):
    """transformers reads no ``mistral3`` GGUF tokenizer by name; its converter writes llama's GPT-2-style fields
    (``GGUF_TOKENIZER_AS``), split as the file's ``tekken`` says: a digit alone, a capital starting a piece."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5}
    path = write_bpe_tokenizer_gguf(tmp_path / "mistral3-tokenizer.gguf", "mistral3", keys, "tekken",
                                    bundled_tokenizer.hf)
    loaded = Tokenizer.load(path)
    text = "Devstral 2 runs here: 2026."
    assert loaded.decode(loaded.encode_plain(text)) == text
    pieces = [p for p, _ in loaded.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("HelloWorld 123")]
    assert pieces == ["Hello", "World", "Ġ", "1", "2", "3"], pieces
