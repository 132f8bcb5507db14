"""GLM-4-0414 / GLM-Z1 GGUF files (llama.cpp's ``glm4``), written from tiny transformers models the way its converter
writes them (the four norms as ``attn_norm``, ``post_attention_norm``, ``ffn_norm``, ``post_ffw_norm``; the fused
gate/up as ``ffn_up``; the rotated half of the head as ``rope.dimension_count``; nothing permuted), load into the
decoder whose float32 logits equal the HF twin's, quantised too; the config equals the one read from the model's
``config.json``, torch-free alike; ``<|user|>`` and ``<|observation|>`` end generation."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from services.engine.errors import ModelLoadError
from services.engine.weights.gguf_metadata import read_gguf_config
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
GLM4 = dict(head_dim=32, partial_rotary_factor=0.5, attention_bias=True, rope_theta=10000.0, tie_word_embeddings=False,
            pad_token_id=0)


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return F32 if name.endswith(("norm.weight", ".bias")) else Q8_0


def write_glm4_gguf(model, path: Path, quant=all_f32, more: dict | None = None) -> Path:
    """``model`` as llama.cpp's converter writes it (``more``: other keys), and the file's dequantised values loaded
    into ``model``; the vocabulary's 90 and 91 are GLM's ``<|user|>`` and ``<|observation|>``."""
    cfg = model.config
    rope = cfg.rope_parameters
    keys = {"context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
            "block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
            "rope.dimension_count": int(cfg.head_dim * rope.get("partial_rotary_factor", 0.5)),
            "rope.freq_base": float(rope["rope_theta"]), "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps)}
    writer = gguf.GGUFWriter(str(path), "glm4")
    tokens = [f"t{i}" for i in range(96)]
    tokens[90:92] = ["<|user|>", "<|observation|>"]
    add_metadata(writer, "glm4", {**keys, **(more or {})}, tokens)
    writer.add_uint32("tokenizer.ggml.eot_token_id", 90)  # as its converter writes it (no eom)
    add = tensor_adder(writer, gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM4, cfg.num_hidden_layers), quant)
    twin = {name: add(name, array) for name, array in _hf_tensors(model).items()}
    close_writer(writer)
    _load_twin(model, twin)
    return path


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
def test_a_glm4_file_gives_transformers_logits(tmp_path, quant):
    model = tiny_hf("glm4", vocab_size=96, **GLM4)
    path = write_glm4_gguf(model, tmp_path / "tiny-glm4.gguf", quant)
    cfg = read_as_the_twin(path, model, IDS)
    assert cfg.eos_token_ids == (2, 90, 91) and cfg.rotary_dim == 16 and cfg.qkv_bias


def test_a_glm4_v_text_file_is_refused_by_name(tmp_path):
    path = write_glm4_gguf(tiny_hf("glm4", vocab_size=96, **GLM4), tmp_path / "tiny-glm4v.gguf",
                           more={"rope.dimension_sections": [4, 2, 2, 0]})
    with pytest.raises(ModelLoadError, match=r"rope\.dimension_sections"):
        read_gguf_config(path)
