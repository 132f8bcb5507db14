"""GLM-4.5/4.6/4.7 GGUF files (llama.cpp's ``glm4moe``), written from tiny transformers models the way its converter
writes them (the norm before the MLP as ``post_attention_norm``, the router's correction bias as ``exp_probs_b.bias``,
the experts stacked per projection, the rotated part of the head as ``rope.dimension_count``, the multi-token
prediction layer as a last block, nothing permuted), load into the decoder whose float32 logits equal the HF twin's
(the twin carries the file's dequantised weights), quantised too; the config equals the one read from the model's
``config.json``, torch-free alike; other routing is refused by name."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
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
    read_as_the_twin,
    tensor_adder,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
# GLM-4.5's and 4.6's kind: q/k norms, q/k/v biases, rope on half of each head, the best of two groups
GLM45 = dict(head_dim=32, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
             first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
             use_qk_norm=True, attention_bias=True, partial_rotary_factor=0.5, rope_theta=1000000.0,
             tie_word_embeddings=False)
# GLM-4.5-Air's: no q/k norms, one group, two shared experts, scale 1.8 (not a float32 number); here also two dense
# layers first and the weights not renormalised (keys llama.cpp reads as absent: false)
AIR = {**GLM45, "use_qk_norm": False, "n_group": 1, "topk_group": 1, "n_shared_experts": 2,
       "routed_scaling_factor": 1.8, "num_hidden_layers": 3, "first_k_dense_replace": 2, "norm_topk_prob": False}


def _tiny(kind: dict):
    model = tiny_hf("glm4_moe", vocab_size=96, **kind)
    with torch.no_grad():  # transformers starts the correction bias at 0: drawn so that a misplaced one shows
        for name, buffer in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.5)
    return model


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    """Q8_0 but the norms, the router and the biases, as llama.cpp's converter keeps them."""
    return F32 if name.endswith(("norm.weight", "ffn_gate_inp.weight", ".bias")) else Q8_0


def _metadata(cfg) -> dict:
    """What llama.cpp's converter writes for a GLM-4.5 config (the prediction layer a block after the last)."""
    return {"context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
            "block_count": cfg.num_hidden_layers + 1, "nextn_predict_layers": 1,
            "feed_forward_length": cfg.intermediate_size, "attention.head_count": cfg.num_attention_heads,
            "attention.head_count_kv": cfg.num_key_value_heads, "attention.key_length": cfg.head_dim,
            "attention.value_length": cfg.head_dim, "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
            "rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
            "rope.dimension_count": int(cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.5)),
            "expert_count": cfg.n_routed_experts, "expert_used_count": cfg.num_experts_per_tok,
            "expert_feed_forward_length": cfg.moe_intermediate_size, "expert_shared_count": cfg.n_shared_experts,
            "leading_dense_block_count": cfg.first_k_dense_replace, "expert_gating_func": 2,
            "expert_weights_scale": float(cfg.routed_scaling_factor),
            "expert_weights_norm": True if cfg.norm_topk_prob else None,
            "expert_group_count": cfg.n_group, "expert_group_used_count": cfg.topk_group}


def write_glm4moe_gguf(model, path: Path, quant=all_f32, keys: dict | None = None) -> Path:
    """``model`` as llama.cpp's converter writes it, with a few tensors of a prediction layer after the last, and the
    file's dequantised values loaded into ``model``."""
    cfg = model.config
    layers = cfg.num_hidden_layers
    writer = gguf.GGUFWriter(str(path), "glm4moe")
    add_metadata(writer, "glm4moe", _metadata(cfg) | (keys or {}), [f"t{i}" for i in range(96)])
    for key, value in {"eot_token_id": 90, "eom_token_id": 91}.items():  # GLM's <|user|> and <|observation|>
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    add = tensor_adder(writer, gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM4_MOE, layers + 1), quant)
    twin: dict[str, np.ndarray] = {}
    for name, array in _hf_tensors(model).items():
        if name.endswith("e_score_correction_bias"):  # the converter's exp_probs_b, kept in float32
            layer = name.split(".")[2]
            twin[name] = add_tensor_as(writer, f"blk.{layer}.exp_probs_b.bias", array, lambda _: F32)
            continue
        twin[name] = add(name, array)
    for name, shape in [("nextn.eh_proj", (cfg.hidden_size, 2 * cfg.hidden_size)), ("attn_norm", (cfg.hidden_size,)),
                        ("ffn_gate_inp", (cfg.n_routed_experts, cfg.hidden_size))]:
        writer.add_tensor(f"blk.{layers}.{name}.weight", np.ones(shape, dtype=np.float32))
    close_writer(writer)
    _load_twin(model, twin)
    return path


@pytest.mark.parametrize(("kind", "quant", "keys"), [
    (GLM45, all_f32, {}), (GLM45, _quantised, {}),
    (AIR, all_f32, {"expert_gating_func": None})],  # a file naming no gating function: llama.cpp's default, the sigmoid
    ids=["glm-4.5", "glm-4.5-q8", "glm-4.5-air"])
def test_a_glm4moe_file_gives_transformers_logits(tmp_path, kind, quant, keys):
    model = _tiny(kind)
    path = write_glm4moe_gguf(model, tmp_path / "tiny-glm4moe.gguf", quant, keys)
    cfg = read_as_the_twin(path, model, IDS)
    assert cfg.eos_token_ids == (2, 90, 91) and cfg.qk_norm == kind["use_qk_norm"]


def test_routing_other_than_the_sigmoid_is_refused_by_name(tmp_path):
    path = write_glm4moe_gguf(_tiny(AIR), tmp_path / "tiny-glm4moe.gguf", keys={"expert_gating_func": 1})
    with pytest.raises(ModelLoadError, match="expert_gating_func 1 is not supported"):
        read_gguf_config(path)
