"""Falcon-H1 GGUF files (llama.cpp's ``falcon-h1``), written from tiny transformers models the way its converter writes
them (every muP multiplier folded into the weights, q/k not permuted, Mamba-2's ``ssm_a = -exp(A_log)`` and ``ssm_d``
as ``[heads, 1]``, the mixer's norm as ``[groups, width]``, the convolution squeezed, ``ffn_norm`` without ``.weight``),
load into the Falcon-H1 decoder with every scale 1 and give the twin's float32 logits; the gateway reads the same
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
    _hf_tensors,
    _load_twin,
    add_metadata,
    add_tensor_as,
    all_f32,
    close_writer,
    hf_logits,
    pdserve_logits,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
_FALCON = dict(num_hidden_layers=3, head_dim=16, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=16,
               mamba_n_groups=2, mamba_d_conv=4, embedding_multiplier=1.5, lm_head_multiplier=0.7,
               key_multiplier=0.8, attention_in_multiplier=1.2, attention_out_multiplier=0.9, ssm_in_multiplier=1.1,
               ssm_out_multiplier=0.6, ssm_multipliers=[0.5, 1.3, 0.8, 1.2, 0.7], mlp_multipliers=[1.4, 0.6],
               rope_theta=100000.0)
MODELS = {
    # the larger releases' kind: the mixer's grouped norm after the gate, an untied head
    "normed": dict(_FALCON, mamba_rms_norm=True, mamba_norm_before_gate=False, tie_word_embeddings=False),
    # the 0.5B's kind: no norm in the mixer; tied, its multipliers 1 (llama.cpp folds only the embedding's into a tied
    # head: with other multipliers it serves other logits than transformers')
    "no-norm": dict(_FALCON, mamba_rms_norm=False, tie_word_embeddings=True, embedding_multiplier=1.0,
                    lm_head_multiplier=1.0),
}


def _model(name: str):
    model = tiny_hf("falcon_h1", **MODELS[name])
    with torch.no_grad():  # the step bias and the skip, which tiny_hf leaves as transformers starts them
        for param_name, param in model.named_parameters():
            if param_name.endswith(("dt_bias", ".D")):
                param.copy_(0.5 * torch.randn_like(param))
    return model


def _folded(cfg) -> dict[str, np.ndarray | float]:
    """What the converter multiplies each tensor by, by the end of its HF name (a scalar, or per row)."""
    inner, state = cfg.mamba_d_ssm, cfg.mamba_n_groups * cfg.mamba_d_state
    rows = [inner, inner, state, state, cfg.mamba_n_heads]  # z, x, B, C, dt
    mup = np.concatenate([np.full(n, m, dtype=np.float32) for n, m in zip(rows, cfg.ssm_multipliers, strict=True)])
    return {"feed_forward.down_proj.weight": cfg.mlp_multipliers[1],
            "feed_forward.gate_proj.weight": cfg.mlp_multipliers[0],
            "self_attn.k_proj.weight": cfg.key_multiplier * cfg.attention_in_multiplier,
            "self_attn.q_proj.weight": cfg.attention_in_multiplier,
            "self_attn.v_proj.weight": cfg.attention_in_multiplier,
            "self_attn.o_proj.weight": cfg.attention_out_multiplier,
            "mamba.out_proj.weight": cfg.ssm_out_multiplier,
            "mamba.in_proj.weight": (cfg.ssm_in_multiplier * mup)[:, None],
            "lm_head.weight": cfg.lm_head_multiplier, "embed_tokens.weight": cfg.embedding_multiplier}


def write_falcon_h1_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values (unfolded) loaded into it."""
    cfg, arch = model.config, "falcon-h1"
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.FALCON_H1, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    add_metadata(writer, arch, {
        "block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
        "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
        "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        "rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
        "vocab_size": cfg.vocab_size, "ssm.conv_kernel": cfg.mamba_d_conv, "ssm.state_size": cfg.mamba_d_state,
        "ssm.group_count": cfg.mamba_n_groups, "ssm.inner_size": cfg.mamba_d_ssm,
        "ssm.time_step_rank": cfg.mamba_n_heads}, [f"<t{i}>" for i in range(cfg.vocab_size)])
    folds, twin = _folded(cfg), {}
    for name, array in _hf_tensors(model).items():
        fold = next((m for end, m in folds.items() if name.endswith(end)), 1.0)
        stored_as, back = lambda a: a, lambda a: a
        if name.endswith(".mamba.dt_bias"):  # renamed dt_proj.bias by the converter
            gguf_name = f"blk.{name.split('.')[2]}.ssm_dt.bias"
        else:
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if name.endswith(".A_log"):
            stored_as, back = (lambda a: -np.exp(a).reshape(-1, 1)), (lambda a: np.log(-a).reshape(-1))
        elif name.endswith((".mamba.D", ".mamba.norm.weight")):
            groups = 1 if name.endswith(".D") else cfg.mamba_n_groups
            stored_as, back = (lambda a, g=groups: a.reshape(g, -1) if g > 1 else a.reshape(-1, 1)), \
                (lambda a: a.reshape(-1))
        elif name.endswith(".conv1d.weight"):
            stored_as, back = (lambda a: a[:, 0, :]), (lambda a: a[:, None, :])
        assert gguf_name is not None, name
        twin[name] = back(add_tensor_as(writer, gguf_name, stored_as(array * fold), quant)) / fold
    close_writer(writer)
    _load_twin(model, twin)
    return path


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return Q8_0 if name.endswith(("ssm_in.weight", "ssm_out.weight", "attn_q.weight", "attn_k.weight",
                                  "ffn_up.weight", "ffn_gate.weight")) else F32


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_falcon_h1_file_gives_transformers_logits(tmp_path, name, quant):
    model = _model(name)
    path = write_falcon_h1_gguf(model, tmp_path / f"tiny-{name}.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    assert cfg.architecture == "falcon_h1" and cfg.kv_layers == (0, 1, 2) and cfg.mamba.layers == (0, 1, 2)
    assert cfg.falcon_h1.mamba_norm == (name == "normed") and not cfg.falcon_h1.norm_before_gate
    assert cfg.tie_word_embeddings == (name == "no-norm")
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    expected = hf_logits(model, IDS)
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), (ours - expected).abs().max()
