"""Qwen3-Next GGUF files (llama.cpp's ``qwen3next``), written from a tiny transformers model the way its converter
writes them (``in_proj_qkvz`` split per key head into ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (z), the
value heads left grouped by key head; ``in_proj_ba`` kept fused as ``ssm_ba``; ``ssm_a = -exp(A_log)``; the
convolution squeezed; norms stored as ``1 + w`` but the DeltaNet's gated norm; the experts' fused gate/up split in
two stacks), load into the hybrid decoder whose float32 logits equal the HF twin's; the config equals the one read
from the model's ``config.json``, torch-free alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.qwen3_5_gguf import qwen3_next_from_gguf
from services.engine.model.registry import config_from_hf, model_class
from services.engine.weights import load_weights
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.tiny_gguf import (
    F32,
    Q8_0,
    add_metadata,
    all_f32,
    close_writer,
    hf_logits,
    pdserve_logits,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
# the value heads (4) twice the key heads (2): a reorder of them shows
NEXT = dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2, head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, partial_rotary_factor=0.5, tie_word_embeddings=False)


def _split_qkvz(cfg, qkvz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The converter's ``attn_qkv`` and ``attn_gate`` of ``in_proj_qkvz`` (per key head: q, k, its value heads' v,
    their z)."""
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    ratio = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    grouped = qkvz.reshape(cfg.linear_num_key_heads, 2 * dk + 2 * ratio * dv, -1)
    q, k, v, z = np.split(grouped, np.cumsum([dk, dk, ratio * dv])[:3], axis=1)
    flat = [part.reshape(-1, qkvz.shape[-1]) for part in (q, k, v, z)]
    return np.concatenate(flat[:3]), flat[3]


def _joined_qkvz(cfg, qkv: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``in_proj_qkvz`` back from the file's two tensors (the inverse of :func:`_split_qkvz`)."""
    dk, heads = cfg.linear_key_head_dim, cfg.linear_num_key_heads
    q, k, v = np.split(qkv, [heads * dk, 2 * heads * dk])
    per_head = [part.reshape(heads, -1, qkv.shape[-1]) for part in (q, k, v, z)]
    return np.concatenate(per_head, axis=1).reshape(-1, qkv.shape[-1])


def write_qwen3_next_gguf(model, path: Path, quant=all_f32, legacy: bool = False) -> Path:
    """``model`` as llama.cpp's converter writes it (``legacy``: as its first versions did, ``in_proj_qkvz`` whole as
    ``ssm_in``; a yarn rope as its ``rope.scaling.*`` keys), and the file's dequantised values loaded into
    ``model``."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "qwen3next")
    keys = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
            "rope.dimension_count": cfg.head_dim // 2, "rope.freq_base": 10000.0,
            "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "vocab_size": cfg.vocab_size,
            "expert_count": cfg.num_experts, "expert_used_count": cfg.num_experts_per_tok,
            "expert_feed_forward_length": cfg.moe_intermediate_size,
            "expert_shared_feed_forward_length": cfg.shared_expert_intermediate_size,
            "ssm.conv_kernel": cfg.linear_conv_kernel_dim, "ssm.state_size": cfg.linear_key_head_dim,
            "ssm.group_count": cfg.linear_num_key_heads, "ssm.time_step_rank": cfg.linear_num_value_heads,
            "ssm.inner_size": cfg.linear_num_value_heads * cfg.linear_value_head_dim,
            "full_attention_interval": 2}
    rope = cfg.rope_parameters
    if rope.get("rope_type") == "yarn":
        keys.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(rope["factor"]),
                     "rope.scaling.original_context_length": rope["original_max_position_embeddings"]})
    add_metadata(writer, "qwen3next", keys, [f"<t{i}>" for i in range(cfg.vocab_size)])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3NEXT, cfg.num_hidden_layers)

    def add(gguf_name: str, array: np.ndarray) -> np.ndarray:
        qtype = quant(gguf_name)
        stored = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
        writer.add_tensor(gguf_name, stored, raw_dtype=None if qtype == F32 else qtype)
        return np.asarray(gguf.quants.dequantize(stored, qtype), dtype=np.float32).reshape(array.shape)

    state = {}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy().copy()
        block = f"blk.{name.split('.')[2]}." if ".layers." in name else ""
        if name.endswith("in_proj_qkvz.weight") and legacy:
            back = add(block + "ssm_in.weight", array)
        elif name.endswith("in_proj_qkvz.weight"):
            qkv, z = _split_qkvz(cfg, array)
            back = _joined_qkvz(cfg, add(block + "attn_qkv.weight", qkv), add(block + "attn_gate.weight", z))
        elif name.endswith("linear_attn.dt_bias"):
            back = add(block + "ssm_dt.bias", array)
        elif name.endswith("linear_attn.A_log"):
            back = np.log(-add(block + "ssm_a", -np.exp(array)))
        elif name.endswith("conv1d.weight"):
            back = add(block + "ssm_conv1d.weight", array[:, 0, :])[:, None, :]
        elif name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, hidden]: gate rows, then up rows
            gate, up = np.split(array, 2, axis=1)
            back = np.concatenate([add(block + "ffn_gate_exps.weight", gate), add(block + "ffn_up_exps.weight", up)],
                                  axis=1)
        elif name.endswith("mlp.experts.down_proj"):
            back = add(block + "ffn_down_exps.weight", array)
        elif name.endswith("shared_expert_gate.weight"):  # squeezed to [hidden]
            back = add(block + "ffn_gate_inp_shexp.weight", array.reshape(-1)).reshape(1, -1)
        else:
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            assert gguf_name is not None, name
            offset = np.float32(1.0 if name.endswith("norm.weight") and "linear_attn" not in name else 0.0)
            back = add(gguf_name, array + offset) - offset
        state[name] = torch.from_numpy(np.ascontiguousarray(back))
    close_writer(writer)
    model.load_state_dict(state)
    return path


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    """The projections whose rows the loader moves in Q8_0 (``attn_qkv``, ``attn_gate``, ``ssm_ba``, the gated q);
    the rest F32."""
    return Q8_0 if name.endswith(("attn_q.weight", "attn_qkv.weight", "attn_gate.weight", "ssm_ba.weight",
                                  "ssm_out.weight")) else F32


# a long-context release's kind: yarn over an original context of 16, so that it moves the 45-token prompt's logits
YARN = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                            "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}


def _model(seed: int = 0, **overrides):
    """The tiny twin, its zero-centred norms (``1 + w``) drawn around 0 as a checkpoint's are (tiny_hf's draw around
    1 doubles every scale, which leaves the recurrence ill-conditioned), the DeltaNet's gated norm around 1."""
    model = tiny_hf("qwen3_next", seed=seed, **{**NEXT, **overrides})
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and "linear_attn.norm" not in name:
                param.sub_(1.0)
    return model


@pytest.mark.parametrize(("quant", "legacy", "overrides"), [(all_f32, False, {}), (_quantised, False, {}),
                                                           (all_f32, True, {}), (all_f32, False, YARN)],
                         ids=["f32", "q8_0", "legacy-ssm_in", "yarn"])
def test_a_qwen3_next_file_gives_transformers_logits(tmp_path, quant, legacy, overrides):
    model = _model(**overrides)
    path = write_qwen3_next_gguf(model, tmp_path / "tiny-qwen3next.gguf", quant, legacy)
    weights = load_weights(path)
    cfg = weights.config
    expected = config_from_hf(model.config.to_dict())
    assert cfg == dataclasses.replace(expected, name=cfg.name, eos_token_ids=cfg.eos_token_ids,
                                      rms_norm_eps=cfg.rms_norm_eps)
    assert cfg.architecture == "qwen3_next" and cfg.linear_attention.layers == (0, 2) and cfg.rotary_dim == 8
    assert cfg.moe.norm_topk_prob and cfg.moe.sparse_layers == (0, 1, 2, 3)
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    # the file reads as the checkpoint of the same weights does, to the bit: pdserve's own safetensors path (which
    # the family tests hold to transformers' greedy tokens)
    model.save_pretrained(tmp_path / "checkpoint")
    checkpoint = load_weights(tmp_path / "checkpoint")
    assert torch.equal(ours, pdserve_logits(model_class(cfg.architecture)(checkpoint.config, checkpoint.tensors,
                                                                          torch.float32), IDS))
    # and near transformers' logits: pdserve's float32 recurrence strays up to 5e-4 from transformers' float64 run
    # here (transformers' float32 1e-4); a misread tensor is 1e-1 off
    assert torch.allclose(ours, hf_logits(model, IDS), atol=3e-3, rtol=0)


def test_the_writer_s_float32_file_stands_for_the_model_itself(tmp_path):
    """The test's own inverse of the converter's transforms gives back every tensor (so the twin is the model)."""
    model = _model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    write_qwen3_next_gguf(model, tmp_path / "tiny-qwen3next.gguf")
    for name, tensor in model.state_dict().items():
        assert torch.allclose(tensor, before[name], atol=1e-6), name


def test_an_ssm_ba_of_another_width_is_refused_by_name(tmp_path):
    path = write_qwen3_next_gguf(_model(), tmp_path / "tiny-qwen3next.gguf")
    cfg = read_gguf_config(path)
    tensors = {"model.layers.0.linear_attn.in_proj_ba.weight": torch.zeros(6, 64)}
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ssm_ba has 6 rows, the config needs 8"):
        qwen3_next_from_gguf(tensors, cfg)
    assert load_weights(path).config == cfg
