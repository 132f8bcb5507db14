"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini GGUF files (llama.cpp's ``phi3``), written from tiny transformers models the
way its converter writes them (the fused ``attn_qkv`` and gate/up ``ffn_up``; the rotated part of the head as
``rope.dimension_count``; the window as ``attention.sliding_window``, 0 for none; longrope as ``rope_factors_short``
and ``rope_factors_long`` tensors with the context lengths and ``attn_factor``, no rope type; nothing permuted), load
into the Phi-3 decoder whose float32 logits equal the HF twin's (the twin carries the file's dequantised weights),
quantised too; the config equals the one read from the model's ``config.json``, torch-free alike; ``<|end|>`` ends
generation."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.engine.tiny_gguf import (
    F32,
    Q8_0,
    _hf_tensors,
    _load_twin,
    add_metadata,
    all_f32,
    close_writer,
    read_as_the_twin,
    tensor_adder,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
END = 93  # <|end|>'s id in the tiny vocabulary
# Phi-3-mini-4k's kind: a window on every layer, the whole head rotated, its own head
PHI3 = dict(sliding_window=24, rope_theta=250000.0, tie_word_embeddings=False)
# Phi-4-mini's: 3/4 of each head rotated, longrope over 4 times its original 512 (served up to it: its factor and
# attention factor from the growth), a tied head
PHI4_MINI = dict(partial_rotary_factor=0.75, rope_theta=10000.0, tie_word_embeddings=True,
                 max_position_embeddings=2048, original_max_position_embeddings=512,
                 rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.9, 2.6, 4.0, 7.5],
                               "long_factor": [1.1, 2.0, 3.5, 8.0, 16.0, 40.0],
                               "original_max_position_embeddings": 512})


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return F32 if name.endswith("norm.weight") else Q8_0


def write_phi3_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into ``model``."""
    cfg = model.config
    rope = cfg.rope_parameters
    original = rope.get("original_max_position_embeddings") or cfg.original_max_position_embeddings
    rope_dims = int(rope.get("partial_rotary_factor", 1.0) * cfg.hidden_size) // cfg.num_attention_heads
    keys = {"context_length": cfg.max_position_embeddings, "rope.scaling.original_context_length": original,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "block_count": cfg.num_hidden_layers, "attention.head_count": cfg.num_attention_heads,
            "attention.head_count_kv": cfg.num_key_value_heads,
            "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "rope.dimension_count": rope_dims,
            "rope.freq_base": float(rope["rope_theta"]), "attention.sliding_window": cfg.sliding_window or 0}
    scale = cfg.max_position_embeddings / original
    if rope.get("long_factor"):
        keys["rope.scaling.attn_factor"] = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    writer = gguf.GGUFWriter(str(path), "phi3")
    add_metadata(writer, "phi3", keys, [f"t{i}" for i in range(END)] + ["<|end|>", "t94", "t95"])
    add = tensor_adder(writer, gguf.get_tensor_name_map(gguf.MODEL_ARCH.PHI3, cfg.num_hidden_layers), quant)
    twin = {name: add(name, array) for name, array in _hf_tensors(model).items()}
    if rope.get("long_factor"):
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    close_writer(writer)
    _load_twin(model, twin)
    return path


@pytest.mark.parametrize(("kind", "quant"), [(PHI3, all_f32), (PHI3, _quantised), (PHI4_MINI, all_f32)],
                         ids=["phi-3-window", "phi-3-q8", "phi-4-mini-longrope"])
def test_a_phi3_file_gives_transformers_logits(tmp_path, kind, quant):
    model = tiny_hf("phi3", vocab_size=96, pad_token_id=0, **kind)
    path = write_phi3_gguf(model, tmp_path / "tiny-phi3.gguf", quant)
    cfg = read_as_the_twin(path, model, IDS)
    assert cfg.eos_token_ids == (2, END)
    assert cfg.max_position == 512 and (cfg.rope_scaling is None or cfg.rope_scaling.factor == 4.0)
