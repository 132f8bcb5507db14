"""LFM2 and LFM2-MoE GGUF files (llama.cpp's ``lfm2`` and ``lfm2moe``, the form Liquid AI releases them in), written
from tiny transformers models the way its converter writes them (the convolution's channel dim squeezed out, the
attention layers marked by a per-layer ``head_count_kv``, the final norm as ``token_embd_norm``, experts stacked per
projection, the router's correction bias as ``exp_probs_b.bias``), load into LFM2's decoder whose float32 logits
equal the HF twin's (the twin carries the file's dequantised weights), quantised files too; the config is read as
llama.cpp reads it, torch-free alike."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_gguf, model_class
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
    tensor_adder,
    tiny_hf,
    write_bpe_tokenizer_gguf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]  # 45 tokens: three KV blocks of 16
LAYERS = ["conv", "full_attention", "conv"]


def _tiny(moe: bool):
    common = dict(num_hidden_layers=3, layer_types=LAYERS, conv_L_cache=3, norm_eps=1e-5, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    if not moe:
        return tiny_hf("lfm2", block_multiple_of=32, intermediate_size=128, **common)  # an MLP 96 wide
    model = tiny_hf("lfm2_moe", num_dense_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    **common)
    with torch.no_grad():  # the router's correction bias drawn too (a buffer, which tiny_hf leaves at 0)
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias"):
                buffer.normal_(0.0, 0.5)
    return model


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    """Norms, the router and its bias, and the convolution taps in F32; projections Q8_0, MLP and experts Q4_0."""
    if name.endswith(("norm.weight", ".bias", "ffn_gate_inp.weight", "shortconv.conv.weight")):
        return F32
    return Q4_0 if "ffn_" in name else Q8_0


def write_lfm2_gguf(model, path: Path, quant=all_f32) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into ``model``."""
    cfg = model.config
    moe = cfg.model_type == "lfm2_moe"
    arch = "lfm2moe" if moe else "lfm2"
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LFM2MOE if moe else gguf.MODEL_ARCH.LFM2, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    width = model.model.layers[0].feed_forward.w1.weight.shape[0]  # the width transformers derived
    keys = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": width,
            "attention.head_count": cfg.num_attention_heads, "rope.freq_base": 1000000.0,
            "attention.layer_norm_rms_epsilon": float(cfg.norm_eps), "vocab_size": cfg.vocab_size,
            "shortconv.l_cache": cfg.conv_L_cache}
    if moe:
        keys.update({"expert_count": cfg.num_experts, "expert_used_count": cfg.num_experts_per_tok,
                     "expert_feed_forward_length": cfg.moe_intermediate_size,
                     "leading_dense_block_count": cfg.num_dense_layers, "expert_gating_func": 2})  # 2: sigmoid
    keys["attention.head_count_kv"] = [cfg.num_key_value_heads if kind == "full_attention" else 0
                                       for kind in cfg.layer_types]
    add_metadata(writer, arch, keys, [f"<t{i}>" for i in range(cfg.vocab_size)])

    twin: dict[str, np.ndarray] = {}
    add = tensor_adder(writer, names, quant)

    for hf_name, tensor in model.state_dict().items():
        array = tensor.detach().numpy().copy()
        experts = hf_name.replace("model.layers.", "layers.").replace(".experts.gate_up_proj", ".experts.")
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if hf_name.endswith("conv.conv.weight"):  # [hidden, 1, taps]: the converter squeezes it
            twin[hf_name] = add(hf_name, array[:, 0, :])[:, None, :]
        elif hf_name.endswith("experts.gate_up_proj"):  # [E, 2I, hidden]: gate rows, then up rows
            gate, up = np.split(array, 2, axis=1)
            twin[hf_name] = np.concatenate([add(experts + "w1.weight", gate), add(experts + "w3.weight", up)], axis=1)
        elif hf_name.endswith("experts.down_proj"):
            twin[hf_name] = add(hf_name.replace("model.layers.", "layers.").replace("down_proj", "w2.weight"), array)
        elif hf_name.endswith("feed_forward.expert_bias"):
            twin[hf_name] = add(hf_name + ".bias", array)
        else:
            twin[hf_name] = add(hf_name, array)
    close_writer(writer)
    state = {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in twin.items()}
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
    return path


@pytest.mark.parametrize(("moe", "quant"), [(False, all_f32), (False, _quantised), (True, all_f32)],
                         ids=["lfm2", "lfm2-quantised", "lfm2moe"])
def test_an_lfm2_file_gives_transformers_logits(tmp_path, moe, quant):
    model = _tiny(moe)
    path = write_lfm2_gguf(model, tmp_path / "tiny-lfm2.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    assert cfg.architecture == "lfm2" and cfg.short_conv.layers == (0, 2) and cfg.short_conv.conv_kernel == 3
    assert (cfg.num_kv_heads, cfg.intermediate_size, cfg.tie_word_embeddings) == (2, 96, True)
    assert cfg.rms_norm_eps == pytest.approx(1e-5)  # norm_eps, stored as a float32
    if moe:
        moe_cfg = cfg.moe
        assert moe_cfg.sparse_layers == (1, 2) and moe_cfg.sigmoid_routing
        assert (moe_cfg.num_experts, moe_cfg.top_k, moe_cfg.intermediate_size) == (4, 2, 32)
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    theirs = hf_logits(model, IDS)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading


def test_a_file_without_an_attention_layer_is_refused_by_name():
    fields = {"general.architecture": "lfm2", "lfm2.block_count": 2, "lfm2.attention.head_count_kv": [0, 0]}
    with pytest.raises(ModelLoadError, match=r"GGUF lfm2: attention.head_count_kv must give 2 layers, some of them"):
        config_from_gguf(fields)


def test_an_lfm2_moe_file_s_tokenizer_reads_as_lfm2_s(tmp_path, monkeypatch, bundled_tokenizer):
    """transformers reads LFM2's GGUF tokenizer, not LFM2-MoE's by name: the converter writes the same fields, so
    an ``lfm2moe`` file's is read as its kin's (``GGUF_TOKENIZER_AS``); here with the bundled vocabulary."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "shortconv.l_cache": 3, "attention.head_count_kv": [2],
            "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1e6}
    path = write_bpe_tokenizer_gguf(tmp_path / "lfm2moe-tokenizer.gguf", "lfm2moe", keys, "lfm2", bundled_tokenizer.hf)
    text = "Hello world, it's 2026! Liquid models run on a laptop."
    assert Tokenizer.load(path).encode_plain(text) == bundled_tokenizer.encode_plain(text)
