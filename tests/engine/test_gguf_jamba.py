"""Jamba GGUF files (llama.cpp's ``jamba``), written from a tiny transformers model the way its converter writes them
(the attention layers as the non-zero entries of a per-layer ``attention.head_count_kv``, no expert period: the
sparse layers those that hold a router; the experts stacked per projection; Mamba's ``ssm_a = -exp(A_log)``, the
convolution squeezed), load into the Jamba decoder and give the twin's float32 logits; the gateway reads the same
config without torch."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
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
_JAMBA = dict(num_hidden_layers=4, attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2,
              expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=16, mamba_d_conv=4,
              mamba_expand=2, mamba_dt_rank=4, tie_word_embeddings=False)


def write_jamba_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into it."""
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.JAMBA, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "jamba")
    kinds = cfg.layers_block_type
    add_metadata(writer, "jamba", {
        "block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": [cfg.num_key_value_heads if kind == "attention" else 0 for kind in kinds],
        "ssm.conv_kernel": cfg.mamba_d_conv, "ssm.inner_size": cfg.mamba_expand * cfg.hidden_size,
        "ssm.state_size": cfg.mamba_d_state, "ssm.time_step_rank": cfg.mamba_dt_rank,
        "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "expert_count": cfg.num_experts,
        "expert_used_count": cfg.num_experts_per_tok, "vocab_size": cfg.vocab_size},
        [f"<t{i}>" for i in range(cfg.vocab_size)])
    state = model.state_dict()
    for name, tensor in list(state.items()):
        array = tensor.numpy().copy()
        layer = name.split(".")[2] if ".layers." in name else None
        if name.endswith("feed_forward.experts.gate_up_proj"):  # stacked per projection by the converter
            gate, up = np.split(array, 2, axis=1)
            state[name] = torch.from_numpy(np.concatenate(
                [add_tensor_as(writer, f"blk.{layer}.ffn_gate_exps.weight", gate, quant),
                 add_tensor_as(writer, f"blk.{layer}.ffn_up_exps.weight", up, quant)], axis=1))
            continue
        if name.endswith("feed_forward.experts.down_proj"):
            state[name] = torch.from_numpy(add_tensor_as(writer, f"blk.{layer}.ffn_down_exps.weight", array, quant))
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        if name.endswith(".A_log"):
            stored = add_tensor_as(writer, gguf_name, -np.exp(array), quant)
            state[name] = torch.from_numpy(np.log(-stored))
        elif name.endswith(".conv1d.weight"):
            state[name] = torch.from_numpy(add_tensor_as(writer, gguf_name, array[:, 0, :], quant)[:, None, :])
        else:
            state[name] = torch.from_numpy(add_tensor_as(writer, gguf_name, array, quant))
    close_writer(writer)
    model.load_state_dict(state)
    return path


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return Q8_0 if name.endswith(("ssm_in.weight", "ssm_out.weight", "ssm_x.weight", "attn_q.weight",
                                  "ffn_up_exps.weight", "ffn_gate.weight")) else F32


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
def test_a_jamba_file_gives_transformers_logits(tmp_path, quant):
    model = tiny_hf("jamba", **_JAMBA)
    path = write_jamba_gguf(model, tmp_path / "tiny-jamba.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    assert cfg.kv_layers == (1,) and cfg.nope_layers == (1,) and cfg.mamba1.layers == (0, 2, 3)
    assert cfg.mamba1.inner_norms and cfg.mamba1.dt_rank == 4 and cfg.moe.sparse_layers == (1, 3)
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    expected = hf_logits(model, IDS)
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), (ours - expected).abs().max()
