"""Qwen3.5 GGUF files (llama.cpp's ``qwen35``), written from a tiny transformers model the way its converter writes
them (zero-centred norms stored as ``1 + w`` but the DeltaNet's gated norm, ``ssm_a = -exp(A_log)``, the convolution
squeezed to 2-D, value heads tiled instead of grouped by key head, a multi-token-prediction block after the last
layer), load into the hybrid decoder whose float32 logits equal the HF twin's; transformers' own GGUF reader loads the
same file to the same logits, so the file is the one llama.cpp writes as transformers reads it."""

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
    Q4_0,
    Q8_0,
    add_metadata,
    all_f32,
    close_writer,
    hf_logits,
    pdserve_logits,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
# the value heads (4) are twice the key heads (2), so tiled and grouped orders differ
HYBRID = dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2, head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
              linear_conv_kernel_dim=4, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True})
_LEAVES = {"linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
           "linear_attn.in_proj_a.weight": "ssm_alpha.weight", "linear_attn.in_proj_b.weight": "ssm_beta.weight",
           "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.dt_bias": "ssm_dt.bias",
           "linear_attn.A_log": "ssm_a", "linear_attn.norm.weight": "ssm_norm.weight",
           "linear_attn.out_proj.weight": "ssm_out.weight"}


def _tiled(cfg, head_dim: int = 1) -> np.ndarray:
    """The grouped index of each tiled row (the converter's order): ``tiled = grouped[index]``."""
    per_key = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    index = np.arange(cfg.linear_num_value_heads * head_dim).reshape(cfg.linear_num_key_heads, per_key, head_dim)
    return index.transpose(1, 0, 2).reshape(-1)


def _to_gguf(name: str, array: np.ndarray, cfg) -> list[tuple[str, np.ndarray]]:
    """A state-dict tensor as llama.cpp's converter writes it: its name(s) and stored values (the experts'
    ``gate_up_proj`` as two stacks)."""
    per_value, per_head = _tiled(cfg, cfg.linear_value_head_dim), _tiled(cfg)
    key_rows = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
    leaf = next((gguf_leaf for hf, gguf_leaf in _LEAVES.items() if name.endswith(hf)), None)
    if leaf is not None:
        layer = name.split(".")[2]
        if leaf == "ssm_a":
            array = -np.exp(array)
        if leaf in ("ssm_a", "ssm_dt.bias", "ssm_alpha.weight", "ssm_beta.weight"):
            array = array[per_head]
        elif leaf == "attn_gate.weight":
            array = array[per_value]
        elif leaf in ("attn_qkv.weight", "ssm_conv1d.weight"):
            array = np.concatenate([array[:key_rows], array[key_rows:][per_value]])
            array = array[:, 0, :] if leaf == "ssm_conv1d.weight" else array
        elif leaf == "ssm_out.weight":
            array = array[:, per_value]
        return [(f"blk.{layer}.{leaf}", array)]
    moe = cfg.model_type == "qwen3_5_moe_text"
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35MOE if moe else gguf.MODEL_ARCH.QWEN35,
                                     cfg.num_hidden_layers)

    def named(hf_name: str) -> str:
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, hf_name
        return gguf_name

    if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, hidden]: gate rows, then up rows
        gate, up = np.split(array, 2, axis=1)
        return [(named(name.replace("gate_up_proj", "gate_proj.weight")), gate),
                (named(name.replace("gate_up_proj", "up_proj.weight")), up)]
    if name.endswith("mlp.experts.down_proj"):
        return [(named(name + ".weight"), array)]
    if name.endswith("shared_expert_gate.weight"):  # squeezed to [hidden]
        return [(named(name), array.reshape(-1))]
    return [(named(name), array + np.float32(1.0) if name.endswith("norm.weight") else array)]  # stored as 1 + w


def _from_gguf(name: str, stored: np.ndarray, cfg) -> np.ndarray:
    """The state-dict tensor a file's dequantised values stand for (the converter's transforms undone)."""
    per_value, per_head = np.argsort(_tiled(cfg, cfg.linear_value_head_dim)), np.argsort(_tiled(cfg))  # inverses
    key_rows = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
    if name.endswith("linear_attn.A_log"):
        return np.log(-stored)[per_head]
    if name.endswith("shared_expert_gate.weight"):
        return stored.reshape(1, -1)
    if name.endswith(("linear_attn.dt_bias", "in_proj_a.weight", "in_proj_b.weight")):
        return stored[per_head]
    if name.endswith("in_proj_z.weight"):
        return stored[per_value]
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        rows = np.concatenate([stored[:key_rows], stored[key_rows:][per_value]])
        return rows[:, None, :] if name.endswith("conv1d.weight") else rows
    if name.endswith("out_proj.weight") and "linear_attn" in name:
        return stored[:, per_value]
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return stored - np.float32(1.0)
    return stored


def write_qwen3_5_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it (with one multi-token-prediction tensor after the last layer),
    and the file's dequantised values loaded into ``model``."""
    cfg = model.config
    arch = "qwen35moe" if cfg.model_type == "qwen3_5_moe_text" else "qwen35"
    writer = gguf.GGUFWriter(str(path), arch)
    keys = {"block_count": cfg.num_hidden_layers + 1, "nextn_predict_layers": 1,
            "context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
            "attention.head_count": cfg.num_attention_heads,
            "attention.head_count_kv": cfg.num_key_value_heads, "attention.key_length": cfg.head_dim,
            "attention.value_length": cfg.head_dim, "rope.dimension_count": cfg.head_dim // 2,
            "full_attention_interval": 2, "ssm.conv_kernel": cfg.linear_conv_kernel_dim,
            "ssm.state_size": cfg.linear_key_head_dim, "ssm.group_count": cfg.linear_num_key_heads,
            "ssm.time_step_rank": cfg.linear_num_value_heads,
            "ssm.inner_size": cfg.linear_num_value_heads * cfg.linear_value_head_dim, "vocab_size": cfg.vocab_size}
    if arch == "qwen35moe":  # every layer's MLP is experts: no dense width
        keys.update({"expert_count": cfg.num_experts, "expert_used_count": cfg.num_experts_per_tok,
                     "expert_feed_forward_length": cfg.moe_intermediate_size,
                     "expert_shared_feed_forward_length": cfg.shared_expert_intermediate_size})
    else:
        keys["feed_forward_length"] = cfg.intermediate_size
    keys.update({"rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
                 "rope.dimension_sections": [2, 1, 1, 0]})
    add_metadata(writer, arch, keys, [f"<t{i}>" for i in range(cfg.vocab_size)])
    state = {}
    for name, tensor in model.state_dict().items():
        parts = []
        for gguf_name, array in _to_gguf(name, tensor.detach().float().numpy().copy(), cfg):
            qtype = quant(gguf_name)
            stored = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
            writer.add_tensor(gguf_name, stored, raw_dtype=None if qtype == F32 else qtype)
            parts.append(np.asarray(gguf.quants.dequantize(stored, qtype), dtype=np.float32).reshape(array.shape))
        values = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        state[name] = torch.from_numpy(np.ascontiguousarray(_from_gguf(name, values, cfg)))
    writer.add_tensor(f"blk.{cfg.num_hidden_layers}.nextn.eh_proj.weight",  # the MTP block: not read
                      np.zeros((cfg.hidden_size, 2 * cfg.hidden_size), dtype=np.float32))
    close_writer(writer)
    model.load_state_dict(state)
    return path


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    """The projections in Q8_0 (the value-head reorders then move whole rows, and ``ssm_out``'s columns through the
    dequantised values); the rest F32."""
    return Q8_0 if name.endswith(("attn_q.weight", "attn_qkv.weight", "attn_gate.weight", "ssm_out.weight",
                                  "ffn_up.weight")) else F32


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)


@pytest.mark.parametrize(("model_type", "quant"), [("qwen3_5_text", all_f32), ("qwen3_5_text", _quantised),
                                                   ("qwen3_5_moe_text", all_f32)], ids=["f32", "q8_0", "moe"])
def test_a_qwen3_5_file_gives_transformers_logits(tmp_path, model_type, quant):
    model = tiny_hf(model_type, **HYBRID, **(MOE if model_type == "qwen3_5_moe_text" else {}))
    path = write_qwen3_5_gguf(model, tmp_path / "tiny-qwen35.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    assert cfg.architecture == "qwen3_5" and cfg.num_layers == 4  # the MTP block is not a layer
    assert cfg.linear_attention.layers == (0, 2) and cfg.kv_layers == (1, 3)
    assert (cfg.rotary_dim, cfg.attn_output_gate, cfg.tie_word_embeddings) == (8, True, False)
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    theirs = hf_logits(model, IDS)
    # transformers' own float32 run strays from its float64 one (1e-4 here, 4e-3 on the MoE twin: the recurrence
    # carries rounding on from a token where it is ill-conditioned), so pdserve's is held to the float64 run, no
    # further from it than twice transformers' float32 (a misread tensor is 1e-1 off)
    if model_type == "qwen3_5_moe_text":
        model.set_experts_implementation("eager")  # its grouped matmul takes no float64
    exact = hf_logits(model.double(), IDS)
    assert (ours - exact).abs().max() <= 2 * (theirs - exact).abs().max() + 1e-4, \
        ((ours - exact).abs().max(), (theirs - exact).abs().max())
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading


def test_transformers_reads_the_written_file_as_the_twin(tmp_path):
    """The writer's transforms are llama.cpp's as transformers undoes them: its own GGUF reader gives the twin's
    logits."""
    from transformers import AutoModelForCausalLM

    model = tiny_hf("qwen3_5_text", **HYBRID)
    path = write_qwen3_5_gguf(model, tmp_path / "tiny-qwen35.gguf")
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    assert torch.allclose(hf_logits(theirs, IDS), hf_logits(model, IDS), atol=1e-4, rtol=1e-4)


def test_the_writer_s_float32_file_stands_for_the_model_itself(tmp_path):
    """The test's own inverse of the converter's transforms gives back every tensor bit for bit (so the twin is the
    model, and a wrong reorder in the loader could not hide behind one in the twin)."""
    model = tiny_hf("qwen3_5_text", **HYBRID)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    write_qwen3_5_gguf(model, tmp_path / "tiny-qwen35.gguf")
    after = model.state_dict()
    for name, tensor in before.items():
        assert torch.allclose(after[name], tensor, rtol=0, atol=1e-6), name  # the norms' 1 + w - 1 may round


def test_4bit_codes_are_kept_only_where_the_file_s_layout_is_the_model_s(tmp_path):
    """The DeltaNet projections a hook reorders run dense (their codes stand for the tiled layout); the others keep
    their 4-bit codes, each standing for its tensor."""
    model = tiny_hf("qwen3_5_text", **HYBRID)

    def q4(name: str) -> gguf.GGMLQuantizationType:
        return Q4_0 if name.endswith(("attn_qkv.weight", "attn_gate.weight", "ssm_out.weight", "ffn_up.weight",
                                      "attn_q.weight")) else F32

    weights = load_weights(write_qwen3_5_gguf(model, tmp_path / "q4.gguf", q4), keep_q4=True)
    assert "model.layers.0.mlp.up_proj.weight" in weights.quantized
    assert "model.layers.1.self_attn.q_proj.weight" in weights.quantized
    for name in ("in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight"):
        assert f"model.layers.0.linear_attn.{name}" not in weights.quantized, name
    for name, codes in weights.quantized.items():
        assert torch.equal(codes.dequantize(), weights.tensors[name].float()), name

