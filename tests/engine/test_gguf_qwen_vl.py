"""The text GGUF files of Qwen's vision-language models (llama.cpp's ``qwen3vl`` and ``qwen2vl``: its Qwen3 and Qwen2
files with M-RoPE's sections and DeepStack's layer count besides; the vision tower is the separate mmproj file), written
from tiny transformers Qwen3-VL and Qwen2.5-VL models: the float32 logits of a text prompt equal the whole model's
(M-RoPE gives a text token one position in every section), the config equals the one read from ``config.json``,
torch-free alike; the tokenizer reads as Qwen3's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from services.engine.model.registry import config_from_hf
from tests.engine.tiny_gguf import (
    add_metadata,
    all_f32,
    close_writer,
    randomise_norms_and_biases,
    read_as_the_twin,
    tensor_adder,
    write_bpe_tokenizer_gguf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
TEXT = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2)
MROPE = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3]}
VISION3 = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
               deepstack_visual_indexes=[0], patch_size=14)
KINDS = {
    "qwen3vl": dict(model_type="qwen3_vl", tie_word_embeddings=False, vision_config=VISION3,
                    text_config=dict(model_type="qwen3_vl_text", head_dim=16, **TEXT,
                                     rope_parameters=MROPE | {"mrope_interleaved": True})),
    # Qwen3-VL-MoE: experts on every layer, the top-k always renormalised (no converter writes expert_weights_norm)
    "qwen3vlmoe": dict(model_type="qwen3_vl_moe", tie_word_embeddings=False, vision_config=VISION3,
                       text_config=dict(model_type="qwen3_vl_moe_text", head_dim=16, **TEXT, num_experts=8,
                                        num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1,
                                        rope_parameters=MROPE | {"mrope_interleaved": True})),
    "qwen2vl": dict(model_type="qwen2_5_vl", tie_word_embeddings=False,
                    vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                       patch_size=14, fullatt_block_indexes=[0]),
                    text_config=dict(model_type="qwen2_5_vl_text", **TEXT, rope_parameters=MROPE)),
}


def _tiny(kind: str):
    spec = dict(KINDS[kind])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    randomise_norms_and_biases(model)
    return model


def write_text_gguf(model, arch: str, path: Path) -> Path:
    """The text model as llama.cpp's converter writes it (float32: the file is the model itself)."""
    text = model.config.text_config
    keys = {"context_length": text.max_position_embeddings, "embedding_length": text.hidden_size,
            "block_count": text.num_hidden_layers, "feed_forward_length": text.intermediate_size,
            "attention.head_count": text.num_attention_heads, "attention.head_count_kv": text.num_key_value_heads,
            "attention.layer_norm_rms_epsilon": float(text.rms_norm_eps),
            "rope.freq_base": float(text.rope_parameters["rope_theta"]),
            "rope.dimension_sections": [*text.rope_parameters["mrope_section"], 0]}
    if arch in ("qwen3vl", "qwen3vlmoe"):
        keys |= {"attention.key_length": text.head_dim, "attention.value_length": text.head_dim,
                 "n_deepstack_layers": len(model.config.vision_config.deepstack_visual_indexes)}
    if arch == "qwen3vlmoe":
        keys |= {"expert_count": text.num_experts, "expert_used_count": text.num_experts_per_tok,
                 "expert_feed_forward_length": text.moe_intermediate_size}
    writer = gguf.GGUFWriter(str(path), arch)
    add_metadata(writer, arch, keys, [f"t{i}" for i in range(96)])
    model_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    add = tensor_adder(writer, gguf.get_tensor_name_map(model_arch, text.num_hidden_layers), all_f32)
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    for name, tensor in model.state_dict().items():
        name, array = name.replace("model.language_model.", "model."), tensor.numpy()
        if "visual" in name or (tied and name == "lm_head.weight"):  # a tied head: no output.weight
            continue
        if name.endswith("mlp.experts.gate_up_proj"):  # stacked per projection, as the converter writes them
            gate, up = np.split(array, 2, axis=1)
            add(name.replace("gate_up_proj", "gate_proj.weight"), gate)
            add(name.replace("gate_up_proj", "up_proj.weight"), up)
        elif name.endswith("mlp.experts.down_proj"):
            add(name + ".weight", array)
        else:
            add(name, array)
    close_writer(writer)
    return path


@pytest.mark.parametrize("arch", ["qwen3vl", "qwen3vlmoe", "qwen2vl"])
def test_a_qwen_vl_text_file_gives_the_whole_model_s_logits(tmp_path, arch):
    model = _tiny(arch)
    path = write_text_gguf(model, arch, tmp_path / f"tiny-{arch}.gguf")
    hf = config_from_hf(model.config.to_dict())
    if hf.moe is not None:  # the released checkpoints store the stacked experts transposed; the file as the model
        hf = dataclasses.replace(hf, moe=dataclasses.replace(hf.moe, stacked_transposed=False))
    # tied as the model is (config.json's flag says true for its text config; a stored head of its own stays untied)
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    hf = dataclasses.replace(hf, tie_word_embeddings=tied)
    read_as_the_twin(path, model, IDS, expected=hf, file_own=("bos_token_id",))  # the writer's BOS


def test_a_qwen_vl_file_s_tokenizer_is_read_from_its_fields(tmp_path, monkeypatch, bundled_tokenizer):
    """transformers knows no ``qwen3vl`` model type: the tokenizer is built from the file's fields alone
    (``READ_ALONE``), split as its ``qwen2`` pre-tokenizer says (each digit apart)."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-6}
    path = write_bpe_tokenizer_gguf(tmp_path / "qwen3vl-tokenizer.gguf", "qwen3vl", keys, "qwen2", bundled_tokenizer.hf)
    loaded = Tokenizer.load(path)
    pieces = [p for p, _ in loaded.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x 123")]
    assert pieces == ["x", "Ġ", "1", "2", "3"], pieces
    assert loaded.encode_plain("Qwen3-VL reads 2026.") == bundled_tokenizer.encode_plain("Qwen3-VL reads 2026.")
