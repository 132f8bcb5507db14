"""GPT-NeoX GGUF files (llama.cpp's ``gptneox``), written from tiny transformers models the way its converter writes
them (q, k and v regrouped from their head-by-head interleaving into one ``attn_qkv``, ``use_parallel_residual``,
the LayerNorms' epsilon and the rotated part; no rope base), load into the GPT-NeoX decoder and give the twin's
float32 logits, parallel and sequential alike; the gateway reads the same config without torch."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from services.engine.model.registry import model_class
from services.engine.weights import load_weights
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.tiny_gguf import (
    F32,
    Q8_0,
    add_metadata,
    add_tensor_as,
    all_f32,
    close_writer,
    hf_logits,
    pdserve_logits,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]


def write_gpt_neox_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into it."""
    cfg = model.config
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPTNEOX, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "gptneox")
    add_metadata(writer, "gptneox", {
        "context_length": cfg.max_position_embeddings, "embedding_length": hidden,
        "block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
        "rope.dimension_count": int(cfg.rope_parameters["partial_rotary_factor"] * (hidden // heads)),
        "attention.head_count": heads, "attention.layer_norm_epsilon": float(cfg.layer_norm_eps)},
        [f"<t{i}>" for i in range(cfg.vocab_size)])
    writer.add_bool("gptneox.use_parallel_residual", cfg.use_parallel_residual)
    state = model.state_dict()
    for name, tensor in list(state.items()):
        if name.endswith("rotary_emb.inv_freq"):
            continue
        array = tensor.numpy().copy()
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        if ".query_key_value." in name:  # regrouped by the converter: [heads, 3, dim] rows to [3, heads, dim]
            shape = array.shape
            grouped = array.reshape(heads, 3, -1, *shape[1:]).swapaxes(0, 1).reshape(shape)
            stored = add_tensor_as(writer, gguf_name, grouped, quant)
            state[name] = torch.from_numpy(stored.reshape(3, heads, -1, *shape[1:]).swapaxes(0, 1).reshape(shape)
                                           .copy())
        else:
            state[name] = torch.from_numpy(add_tensor_as(writer, gguf_name, array, quant))
    close_writer(writer)
    model.load_state_dict(state)
    return path


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return Q8_0 if name.endswith(("attn_qkv.weight", "attn_output.weight", "ffn_up.weight")) else F32


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_a_gpt_neox_file_gives_transformers_logits(tmp_path, parallel, quant):
    model = tiny_hf("gpt_neox", num_key_value_heads=4, use_parallel_residual=parallel, tie_word_embeddings=False,
                    layer_norm_eps=1e-5)
    path = write_gpt_neox_gguf(model, tmp_path / "tiny-gpt-neox.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    assert cfg.architecture == "gpt_neox" and cfg.parallel_mlp_norm == parallel and cfg.rotary_dim == 4
    assert cfg.mlp_activation == "gelu" and not cfg.tie_word_embeddings
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    expected = hf_logits(model, IDS)
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), (ours - expected).abs().max()
