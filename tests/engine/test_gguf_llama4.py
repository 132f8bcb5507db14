"""Llama 4 GGUF files (llama.cpp's ``llama4``), written from tiny transformers models the way its converter writes them
(q/k rows as the checkpoint's, the experts' fused gate/up split and every stacked expert transposed to llama.cpp's
layout, the dense layers' width as ``feed_forward_length``, llama3 rope as ``rope_freqs``), load into Llama 4's decoder
whose float32 logits equal the HF twin's (the twin carries the file's dequantised weights), quantised files too; the
config is read as llama.cpp reads it (its own chunk, temperature and NoPE step), torch-free alike; the tokenizer is
read as Llama's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_gguf, model_class
from services.engine.weights import load_weights
from services.engine.weights.gguf_cache_config import config_from_dict
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.tiny_gguf import (
    F32,
    Q4_0,
    Q8_0,
    add_metadata,
    all_f32,
    close_writer,
    hf_logits,
    llama3_rope_freqs,
    pdserve_logits,
    tensor_adder,
    tiny_hf,
    write_bpe_tokenizer_gguf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}


def _tiny(experts: int = 4, top_k: int = 1, qk_norm: bool = True):
    return tiny_hf("llama4_text", num_hidden_layers=4, head_dim=16, num_local_experts=experts,
                   num_experts_per_tok=top_k, intermediate_size=32, intermediate_size_mlp=96,
                   interleave_moe_layer_step=2, use_qk_norm=qk_norm, rope_parameters=ROPE, tie_word_embeddings=False)


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    """Norms, the router and rope_freqs in F32; the experts Q4_0; the rest Q8_0."""
    if name.endswith(("norm.weight", "ffn_gate_inp.weight", "rope_freqs.weight")):
        return F32
    return Q4_0 if "_exps" in name else Q8_0


def write_llama4_gguf(model, path: Path, quant=all_f32, extra_keys: dict | None = None) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into ``model``."""
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA4, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "llama4")
    keys = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size_mlp,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "rope.freq_base": float(ROPE["rope_theta"]), "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
            "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
            "rope.dimension_count": cfg.head_dim, "vocab_size": cfg.vocab_size,
            "expert_count": cfg.num_local_experts, "expert_used_count": cfg.num_experts_per_tok,
            "expert_feed_forward_length": cfg.intermediate_size,
            "interleave_moe_layer_step": cfg.interleave_moe_layer_step} | (extra_keys or {})
    add_metadata(writer, "llama4", keys, [f"<t{i}>" for i in range(cfg.vocab_size)])
    twin: dict[str, np.ndarray] = {}
    add = tensor_adder(writer, names, quant)

    for hf_name, tensor in model.state_dict().items():
        array = tensor.detach().numpy().copy()
        if hf_name.endswith("experts.gate_up_proj"):  # [E, hidden, 2I]: transposed, then gate rows and up rows
            gate, up = np.split(array.transpose(0, 2, 1), 2, axis=1)
            stem = hf_name.removesuffix("gate_up_proj")
            twin[hf_name] = np.concatenate([add(stem + "gate_proj.weight", gate), add(stem + "up_proj.weight", up)],
                                           axis=1).transpose(0, 2, 1)
        elif hf_name.endswith("experts.down_proj"):  # [E, I, hidden], stored [E, hidden, I]
            twin[hf_name] = add(hf_name + ".weight", array.transpose(0, 2, 1)).transpose(0, 2, 1)
        else:
            twin[hf_name] = add(hf_name, array)
    rope_freqs = llama3_rope_freqs(cfg)
    writer.add_tensor("rope_freqs.weight", rope_freqs)
    close_writer(writer)
    model.load_state_dict({name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in twin.items()})
    return path


@pytest.mark.parametrize(("experts", "top_k", "quant"), [(4, 1, all_f32), (4, 2, all_f32), (4, 1, _quantised)],
                         ids=["top-1", "top-2", "quantised"])
def test_a_llama4_file_gives_transformers_logits(tmp_path, experts, top_k, quant):
    model = _tiny(experts, top_k)
    path = write_llama4_gguf(model, tmp_path / "tiny-llama4.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    assert cfg.architecture == "llama4" and cfg.nope_layers == (3,) and cfg.rope_interleaved
    assert cfg.moe.sparse_layers == (1, 3) and (cfg.moe.top_k, cfg.moe.intermediate_size) == (top_k, 32)
    assert cfg.intermediate_size == 96 and not cfg.tie_word_embeddings
    assert cfg.llama4.qk_l2_norm and (cfg.llama4.temperature_scale, cfg.llama4.temperature_floor) == (0.1, 8192)
    assert cfg.rope_scaling.freq_factors is not None  # llama3's scaling, as rope_freqs
    assert cfg.max_position == model.config.max_position_embeddings  # the file's context: chunked past 8192
    assert cfg.attention_chunk is None and cfg.chunked_layers == ()  # a context shorter than llama.cpp's chunk
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    theirs = hf_logits(model, IDS)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    assert config_from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg  # the GGUF weights cache's


def test_maverick_s_expert_count_drops_the_qk_norms_as_llama_cpp_does(tmp_path):
    """llama.cpp decides the q/k norms by the model type: not on the 128-expert model (Maverick, whose config says
    ``use_qk_norm`` false); a file whose sliding window is 0 (MobileLLM's), which llama.cpp cannot run, is refused."""
    fields = {"general.architecture": "llama4", "llama4.block_count": 4, "llama4.context_length": 1 << 20,
              "llama4.embedding_length": 64, "llama4.feed_forward_length": 96, "llama4.attention.head_count": 4,
              "llama4.attention.layer_norm_rms_epsilon": 1e-5, "llama4.vocab_size": 100, "llama4.expert_count": 128,
              "llama4.expert_used_count": 1, "llama4.expert_feed_forward_length": 32,
              "llama4.interleave_moe_layer_step": 2}
    cfg = config_from_gguf(fields)
    assert not cfg.llama4.qk_l2_norm and cfg.max_position == 1 << 20 and cfg.nope_layers == (3,)
    assert cfg.attention_chunk == 8192 and cfg.chunked_layers == (0, 1, 2)  # llama.cpp's chunk, on the rotated layers
    assert config_from_gguf(fields | {"llama4.expert_count": 16}).llama4.qk_l2_norm
    with pytest.raises(ModelLoadError, match="GGUF llama4: a file without experts"):
        config_from_gguf(fields | {"llama4.expert_count": 0})
    with pytest.raises(ModelLoadError, match=r"GGUF llama4: attention\.sliding_window 0"):
        config_from_gguf(fields | {"llama4.attention.sliding_window": 0})


def test_a_llama4_file_s_tokenizer_reads_as_llama_s(tmp_path, monkeypatch, bundled_tokenizer):
    """transformers reads Llama's GGUF tokenizer, not Llama 4's by name: the converter writes the same GPT-2-style
    fields, so a ``llama4`` file's is read as its kin's (``GGUF_TOKENIZER_AS``); here with the bundled vocabulary."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5, "expert_count": 2,
            "expert_used_count": 1, "expert_feed_forward_length": 8, "interleave_moe_layer_step": 1}
    path = write_bpe_tokenizer_gguf(tmp_path / "llama4-tokenizer.gguf", "llama4", keys, "llama4",
                                    bundled_tokenizer.hf)
    text = "Hello world, it's 2026! Llama 4 runs here too."
    loaded = Tokenizer.load(path)
    assert loaded.encode_plain(text) == bundled_tokenizer.encode_plain(text)
    # the split is Llama 4's (GPT-4o's, from tokenizer.ggml.pre), not Llama 3's: contractions stay on their word,
    # and a capital starts a piece
    pieces = [p for p, _ in loaded.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("HelloWorld I'LL it's")]
    assert pieces == ["Hello", "World", "ĠI'LL", "Ġit's"], pieces
