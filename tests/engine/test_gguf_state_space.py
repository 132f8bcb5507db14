"""Mamba, Falcon-Mamba (llama.cpp's ``mamba``, ``ssm.dt_b_c_rms`` set) and Mamba-2 (``mamba2``) GGUF files, written
from tiny transformers models the way its converter writes them (``attention.head_count`` 0 and no attention tensor;
``ssm_a = -exp(A_log)``, Mamba-2's ``ssm_a`` and ``ssm_d`` as ``[heads, 1]`` and its gated norm as ``[groups, width]``,
the convolution squeezed, ``dt_bias`` as ``ssm_dt.bias``; ``context_length`` 2**20; a tied head not written), load
into the state-space decoders whose float32 logits equal the HF twin's; the config equals the one read from the model's
``config.json`` but for what the file says itself, torch-free alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.model.registry import config_from_hf, model_class
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
MODELS = {
    "mamba": dict(model_type="mamba", state_size=16, conv_kernel=4, expand=2, time_step_rank=4),
    "falcon_mamba": dict(model_type="falcon_mamba", state_size=16, conv_kernel=4, expand=2, tie_word_embeddings=False),
    "mamba2": dict(model_type="mamba2", num_heads=8, head_dim=16, state_size=16, n_groups=2, conv_kernel=4, expand=2,
                   chunk_size=16, tie_word_embeddings=False),
}


def _model(name: str):
    spec = dict(MODELS[name])
    model = tiny_hf(spec.pop("model_type"), **spec)
    with torch.no_grad():  # the step biases and the skip, which tiny_hf leaves as transformers starts them
        for param_name, param in model.named_parameters():
            if param_name.endswith(("dt_bias", ".D")):
                param.copy_(0.5 * torch.randn_like(param))
    return model


def write_state_space_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into it."""
    cfg = model.config
    two = cfg.model_type == "mamba2"
    arch = "mamba2" if two else "mamba"
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MAMBA2 if two else gguf.MODEL_ARCH.MAMBA, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    inner = cfg.intermediate_size if not two else cfg.num_heads * cfg.head_dim
    keys = {"context_length": 2 ** 20, "embedding_length": cfg.hidden_size, "feed_forward_length": 0,
            "attention.head_count": 0, "block_count": cfg.num_hidden_layers, "ssm.conv_kernel": cfg.conv_kernel,
            "ssm.inner_size": inner, "ssm.state_size": cfg.state_size,
            "ssm.time_step_rank": cfg.num_heads if two else cfg.time_step_rank,
            "attention.layer_norm_rms_epsilon": float(cfg.layer_norm_epsilon), "vocab_size": cfg.vocab_size}
    if two:
        keys["ssm.group_count"] = cfg.n_groups
    add_metadata(writer, arch, keys, [f"<t{i}>" for i in range(cfg.vocab_size)])
    if not two:
        writer.add_bool(f"{arch}.ssm.dt_b_c_rms", cfg.model_type == "falcon_mamba")
    state = model.state_dict()
    for name, tensor in list(state.items()):
        array = tensor.numpy().copy()
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # the converter skips a head equal to the embedding
        if name.endswith(".mixer.dt_bias"):
            gguf_name = f"blk.{name.split('.')[2]}.ssm_dt.bias"
        else:
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        stored = add_tensor_as(writer, gguf_name, _as_written(name, array, cfg), quant)
        back = np.log(-stored) if name.endswith(".A_log") else stored  # (every other one only reshaped)
        state[name] = torch.from_numpy(np.ascontiguousarray(back.reshape(array.shape)))
    close_writer(writer)
    model.load_state_dict(state, strict=False)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return path


def _as_written(name: str, array: np.ndarray, cfg) -> np.ndarray:
    """A tensor as the converter writes it: ``-exp(A_log)``; Mamba-2's ``A`` and ``D`` as columns, its gated norm
    as ``[groups, width]``; the convolution squeezed."""
    two = cfg.model_type == "mamba2"
    if name.endswith(".A_log"):
        return -np.exp(array).reshape(-1, 1) if two else -np.exp(array)
    if name.endswith(".D"):
        return array.reshape(-1, 1) if two else array
    if name.endswith("conv1d.weight"):
        return array[:, 0, :]
    if name.endswith("mixer.norm.weight"):
        return array.reshape(cfg.n_groups, -1)
    return array


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return Q8_0 if name.endswith(("ssm_in.weight", "ssm_out.weight", "ssm_x.weight")) else F32


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_state_space_file_gives_transformers_logits(tmp_path, name, quant):
    model = _model(name)
    path = write_state_space_gguf(model, tmp_path / f"tiny-{name}.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    expected = config_from_hf(model.config.to_dict())
    assert cfg.attention_free and cfg.residual_in_float32 and cfg.max_position == 2 ** 20
    assert cfg == dataclasses.replace(expected, name=cfg.name, eos_token_ids=cfg.eos_token_ids,
                                      rms_norm_eps=cfg.rms_norm_eps)
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    served = cfg.served_within(512)
    ours = pdserve_logits(model_class(cfg.architecture)(served, weights.tensors, torch.float32), IDS)
    assert torch.allclose(ours, hf_logits(model, IDS), atol=1e-4, rtol=1e-4), (ours - hf_logits(model, IDS)).abs().max()
