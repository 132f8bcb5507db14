"""GPT-OSS GGUF files (llama.cpp's ``gpt-oss`` architecture), written from a tiny transformers model the way its
converter writes them (``gate_up_proj`` split into ``ffn_gate_exps`` and ``ffn_up_exps`` with their biases,
``down_proj`` transposed, experts in MXFP4, the sinks as ``attn_sinks.weight``), load into GPT-OSS's decoder whose
float32 logits equal the HF twin's (the twin carries the file's dequantised weights); the config is read as
llama.cpp reads it, torch-free alike; a file missing a part of its experts is refused by name."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.registry import model_class
from services.engine.weights import load_weights
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.tiny_gguf import F32, SHAPE, add_metadata, close_writer, hf_logits, pdserve_logits, tiny_hf

MXFP4 = gguf.GGMLQuantizationType.MXFP4
IDS = [(i * 37 + 5) % 96 for i in range(45)]  # 45 tokens: three KV blocks of 16, past the window of 8
ENDS = {"<|return|>": 90, "<|call|>": 91, "<|endoftext|>": 92}  # harmony's turn ends, found by their text
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 32, "rope_theta": 150000.0}


def _tiny_gpt_oss():
    model = tiny_hf("gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    rope_parameters=YARN, tie_word_embeddings=False)
    with torch.no_grad():  # the sinks and the experts' biases drawn too (tiny_hf draws `.bias` only)
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "_bias")):
                param.copy_(0.5 * torch.randn_like(param))
    return model


def _stored(array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray]:
    """(what the file stores, its float32 dequantisation)."""
    stored = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
    return stored, np.asarray(gguf.quants.dequantize(stored, qtype), dtype=np.float32).reshape(array.shape)


def write_gpt_oss_gguf(model, path: Path, experts: gguf.GGMLQuantizationType = MXFP4,
                       drop: str | None = None) -> Path:
    """``model`` as llama.cpp's converter writes it (``drop``: a GGUF tensor name left out), and the file's
    dequantised values loaded into ``model``."""
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    keys = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "expert_feed_forward_length": cfg.intermediate_size, "attention.head_count": cfg.num_attention_heads,
            "attention.head_count_kv": cfg.num_key_value_heads, "attention.key_length": cfg.head_dim,
            "attention.value_length": cfg.head_dim, "rope.freq_base": YARN["rope_theta"],
            "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "expert_count": cfg.num_local_experts,
            "expert_used_count": cfg.num_experts_per_tok, "attention.sliding_window": cfg.sliding_window,
            "rope.scaling.type": "yarn", "rope.scaling.factor": YARN["factor"],
            "rope.scaling.original_context_length": YARN["original_max_position_embeddings"]}
    tokens = [f"<t{i}>" for i in range(cfg.vocab_size)]
    for text, i in ENDS.items():
        tokens[i] = text
    add_metadata(writer, "gpt-oss", keys, tokens)

    state = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
    twin: dict[str, np.ndarray] = {}

    def add(hf_name: str, array: np.ndarray, qtype: gguf.GGMLQuantizationType = F32) -> np.ndarray:
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        stored, values = _stored(array, qtype)
        if name != drop:
            writer.add_tensor(name, stored, raw_dtype=None if qtype == F32 else qtype)
        return values

    for hf_name, array in state.items():
        p = hf_name.removesuffix("gate_up_proj").removesuffix("gate_up_proj_bias").removesuffix("down_proj") \
            .removesuffix("down_proj_bias")
        if hf_name.endswith("experts.gate_up_proj"):  # [E, hidden, 2I] interleaved -> [E, I, hidden] each
            gate = add(p + "gate_proj.weight", array[:, :, 0::2].transpose(0, 2, 1), experts)
            up = add(p + "up_proj.weight", array[:, :, 1::2].transpose(0, 2, 1), experts)
            twin[hf_name] = np.stack((gate, up), axis=2).reshape(gate.shape[0], -1, gate.shape[2]).transpose(0, 2, 1)
        elif hf_name.endswith("experts.gate_up_proj_bias"):
            gate, up = add(p + "gate_proj.bias", array[:, 0::2]), add(p + "up_proj.bias", array[:, 1::2])
            twin[hf_name] = np.stack((gate, up), axis=2).reshape(gate.shape[0], -1)
        elif hf_name.endswith("experts.down_proj"):  # [E, I, hidden] -> [E, hidden, I]
            twin[hf_name] = add(p + "down_proj.weight", array.transpose(0, 2, 1), experts).transpose(0, 2, 1)
        elif hf_name.endswith("experts.down_proj_bias"):
            twin[hf_name] = add(p + "down_proj.bias", array)
        elif hf_name.endswith("self_attn.sinks"):  # the converter names it sinks.weight
            twin[hf_name] = add(hf_name + ".weight", array)
        else:
            twin[hf_name] = add(hf_name, array)
    close_writer(writer)
    model.load_state_dict({name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in twin.items()})
    return path


@pytest.mark.parametrize("experts", [F32, MXFP4], ids=["f32", "mxfp4"])
def test_a_gpt_oss_file_gives_transformers_logits(tmp_path, experts):
    model = _tiny_gpt_oss()
    path = write_gpt_oss_gguf(model, tmp_path / "tiny-gpt-oss.gguf", experts)
    weights = load_weights(path)
    cfg = weights.config
    assert cfg.architecture == "gpt_oss" and cfg.attention_sinks and cfg.qkv_bias and cfg.o_bias
    assert cfg.layer_windows == (8, None)  # llama.cpp's pattern: sliding from the first layer, every other one
    assert cfg.rope_scaling.rope_type == "yarn" and not cfg.rope_scaling.truncate
    assert (cfg.rope_scaling.factor, cfg.rope_scaling.original_max_position) == (4.0, 32)
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.swiglu_limit, moe.swiglu_alpha, moe.softmax_after_topk) == (
        4, 2, 7.0, 1.702, True)
    assert cfg.eos_token_ids == (2, *ENDS.values()) and not cfg.tie_word_embeddings
    expert = weights.tensors["model.layers.0.mlp.experts.gate_up_proj"]
    assert expert.shape == (4, SHAPE["hidden_size"], 2 * SHAPE["intermediate_size"])
    assert expert.dtype == (torch.bfloat16 if experts == MXFP4 else torch.float32)  # MXFP4 is exact in bf16
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    theirs = hf_logits(model, IDS)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading


@pytest.mark.parametrize("drop", ["blk.1.ffn_up_exps.bias", "blk.0.ffn_down_exps.weight"])
def test_a_file_missing_part_of_its_experts_is_refused_by_name(tmp_path, drop):
    path = write_gpt_oss_gguf(_tiny_gpt_oss(), tmp_path / "partial.gguf", F32, drop=drop)
    with pytest.raises(ModelLoadError, match=rf"gpt-oss layer {drop.split('.')[1]}: its experts lack {drop} "):
        load_weights(path)
