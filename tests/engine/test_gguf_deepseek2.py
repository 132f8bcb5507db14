"""DeepSeek GGUF files (llama.cpp's ``deepseek2``: DeepSeek-V3/R1, Kimi K2, V2-Lite, GLM-4.7-Flash), written from tiny
transformers models the way its converter writes them (``kv_b_proj`` split per head into ``attn_k_b``, transposed,
and ``attn_v_b`` in the MLA files, whole as ``attn_kv_b`` in older ones; the experts stacked per projection; the
router's correction bias as ``exp_probs_b.bias``; yarn's ``mscale_all_dim`` as a tenth of ``yarn_log_multiplier``;
nothing permuted), load into the latent-attention decoder whose float32 logits equal the HF twin's (the twin carries
the file's dequantised weights), quantised files too; the config equals the one read from the model's ``config.json``
and is read torch-free alike; the tokenizers split text as DeepSeek-V3's, Kimi K2's and GLM's do; what llama.cpp
reads otherwise than transformers is refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.weights.gguf_cache_config import config_from_dict
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
    write_bpe_tokenizer_gguf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
IM_END = "<|im_end|>"  # Kimi K2's turn end (its tokenizer's EOS is [EOS]), id 95 in the files written here
LATENT = dict(kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, num_key_value_heads=4,
              tie_word_embeddings=False)
# DeepSeek-V3's kind: a q LoRA, sigmoid routing with the correction bias among the best of two groups, renormalised
# and scaled, a shared expert, the first layer dense; yarn with mscale_all_dim
V3 = dict(q_lora_rank=64, **LATENT, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
          n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
          norm_topk_prob=True,
          rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                           "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                           "rope_theta": 10000.0})
# GLM-4.7-Flash's kind (Glm4MoeLiteForCausalLM, which llama.cpp converts as deepseek2): sigmoid routing with the
# correction bias in one group, renormalised and scaled by 1.8, a shared expert, the first layer dense; no yarn
GLM47_FLASH = dict(q_lora_rank=64, **LATENT, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                   n_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse"], num_hidden_layers=3,
                   routed_scaling_factor=1.8, rms_norm_eps=1e-5, rope_theta=1000000.0)
# V2-Lite's kind: one q projection, softmax over all experts, unnormalised, two shared experts
V2_LITE = dict(q_lora_rank=None, **LATENT, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               n_shared_experts=2, first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0,
               rope_theta=10000.0)
# a file of the tokenizer alone
_TOKENIZER_KEYS = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
                   "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-6}


def _tiny(model_type: str, kind: dict, seed: int = 0):
    model = tiny_hf(model_type, seed=seed, vocab_size=96, **kind)
    with torch.no_grad():  # transformers starts the correction bias at 0: drawn so that a misplaced one shows
        for name, buffer in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.5)
    return model


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    """Q8_0 where each row is whole blocks of 32 (not attn_k_b's 16-wide rows); the norms, the router and its bias F32,
    as llama.cpp's converter keeps them."""
    return F32 if name.endswith(("norm.weight", "ffn_gate_inp.weight", "attn_k_b.weight", ".bias")) else Q8_0


def _metadata(cfg) -> dict:
    heads, rope = cfg.num_attention_heads, cfg.qk_rope_head_dim
    scaling = cfg.rope_parameters if cfg.rope_parameters.get("rope_type") == "yarn" else None
    sigmoid = cfg.model_type in ("deepseek_v3", "glm4_moe_lite")
    first_dense = getattr(cfg, "first_k_dense_replace", None)
    if first_dense is None:  # GLM-4.7-Flash's config.json has both; its transformers config only the kinds
        first_dense = cfg.mlp_layer_types.index("sparse")
    return {"context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
            "block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": heads, "attention.head_count_kv": 1,
            "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
            "rope.freq_base": float(cfg.rope_parameters["rope_theta"]), "rope.dimension_count": rope,
            "leading_dense_block_count": first_dense, "attention.q_lora_rank": cfg.q_lora_rank,
            "attention.kv_lora_rank": cfg.kv_lora_rank, "attention.key_length": cfg.kv_lora_rank + rope,
            "attention.value_length": cfg.kv_lora_rank, "attention.key_length_mla": cfg.qk_nope_head_dim + rope,
            "attention.value_length_mla": cfg.v_head_dim, "expert_feed_forward_length": cfg.moe_intermediate_size,
            "expert_count": cfg.n_routed_experts, "expert_used_count": cfg.num_experts_per_tok,
            "expert_shared_count": cfg.n_shared_experts, "expert_weights_scale": float(cfg.routed_scaling_factor),
            "expert_weights_norm": True if cfg.norm_topk_prob else None, "expert_gating_func": 2 if sigmoid else 1,
            "expert_group_count": cfg.n_group if sigmoid else None,
            "expert_group_used_count": cfg.topk_group if sigmoid else None,
            "rope.scaling.type": "yarn" if scaling else None,
            "rope.scaling.factor": float(scaling["factor"]) if scaling else None,
            "rope.scaling.original_context_length": scaling["original_max_position_embeddings"] if scaling else None,
            "rope.scaling.yarn_log_multiplier": 0.1 * scaling["mscale_all_dim"] if scaling else None}


def write_deepseek2_gguf(model, path: Path, quant=all_f32, keys: dict | None = None, mla: bool = True,
                         mtp: bool = False, token_ids: dict[str, int] | None = None, arch: str = "deepseek2") -> Path:
    """``model`` as llama.cpp's converter writes it (``mla``: kv_b split as its MLA files have it, else whole;
    ``mtp``: a multi-token-prediction block after the last layer, as GLM-4.7-Flash's files have it; ``token_ids``:
    ``tokenizer.ggml.*`` ids; ``arch`` ``mistral4``: Mistral 4's files, the experts' gate and up kept fused as
    ``ffn_gate_up_exps``), and the file's dequantised values loaded into ``model``."""
    cfg = model.config
    layers = cfg.num_hidden_layers
    model_arch = gguf.MODEL_ARCH.MISTRAL4 if arch == "mistral4" else gguf.MODEL_ARCH.DEEPSEEK2
    names = gguf.get_tensor_name_map(model_arch, layers + mtp)
    writer = gguf.GGUFWriter(str(path), arch)
    extra = {"block_count": layers + 1, "nextn_predict_layers": 1} if mtp else {}
    # the last token as Kimi K2's turn end, found by its text
    add_metadata(writer, arch, _metadata(cfg) | extra | (keys or {}), [f"t{i}" for i in range(95)] + [IM_END])
    for key, value in (token_ids or {}).items():
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    if mtp:  # a few of the block's tensors: its own and a decoder layer's (ones a reader that took it would misread)
        for name, shape in [("nextn.eh_proj", (cfg.hidden_size, 2 * cfg.hidden_size)),
                            ("nextn.enorm", (cfg.hidden_size,)), ("attn_norm", (cfg.hidden_size,)),
                            ("ffn_gate_inp", (cfg.n_routed_experts, cfg.hidden_size))]:
            writer.add_tensor(f"blk.{layers}.{name}.weight", np.ones(shape, dtype=np.float32))
    add = tensor_adder(writer, names, quant)
    twin: dict[str, np.ndarray] = {}
    nope, kv_lora, heads = cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.num_attention_heads
    tensors = _hf_tensors(model)
    for name, array in tensors.items():
        layer = name.split(".")[2] if ".layers." in name else ""
        if arch == "mistral4" and name.endswith("mlp.experts.up_proj.weight"):
            continue  # written with its gate
        if arch == "mistral4" and name.endswith("mlp.experts.gate_proj.weight"):
            up = name.replace("gate_proj", "up_proj")
            fused = add_tensor_as(writer, f"blk.{layer}.ffn_gate_up_exps.weight",
                                  np.concatenate([array, tensors[up]], axis=1), quant)
            twin[name], twin[up] = np.split(fused, 2, axis=1)
            continue
        if name.endswith("e_score_correction_bias"):  # the converter's exp_probs_b, kept in float32
            twin[name] = add_tensor_as(writer, f"blk.{layer}.exp_probs_b.bias", array, lambda _: F32)
            continue
        if name.endswith("kv_b_proj.weight") and mla:
            per_head = array.reshape(heads, nope + cfg.v_head_dim, kv_lora)
            k_b = add_tensor_as(writer, f"blk.{layer}.attn_k_b.weight", per_head[:, :nope].transpose(0, 2, 1), quant)
            v_b = add_tensor_as(writer, f"blk.{layer}.attn_v_b.weight", per_head[:, nope:], quant)
            twin[name] = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(array.shape)
            continue
        twin[name] = add(name, array)
    close_writer(writer)
    _load_twin(model, twin)
    return path


@pytest.mark.parametrize(("model_type", "kind", "quant", "mla"), [
    ("deepseek_v3", V3, all_f32, True), ("deepseek_v3", V3, _quantised, True), ("deepseek_v3", V3, all_f32, False),
    ("deepseek_v2", V2_LITE, all_f32, True)], ids=["v3", "v3-q8", "v3-before-mla", "v2-lite"])
def test_a_deepseek2_file_gives_transformers_logits(tmp_path, model_type, kind, quant, mla):
    model = _tiny(model_type, kind)
    path = write_deepseek2_gguf(model, tmp_path / "tiny-deepseek.gguf", quant, mla=mla)
    cfg = read_as_the_twin(path, model, IDS)
    assert cfg.eos_token_ids == (2, 95)
    assert config_from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg  # the GGUF weights cache's


def test_a_glm_4_7_flash_file_with_its_prediction_block_gives_transformers_logits(tmp_path):
    """GLM-4.7-Flash's files are llama.cpp's deepseek2 with a GLM vocabulary: the model is DeepSeek-V3's attention and
    routing (one group, scale 1.8: the sigmoid, though the file names no gating function, its config naming no
    scoring function); the block after the last layer is not read; ``<|user|>`` (``eot_token_id``) and
    ``<|observation|>`` (``eom_token_id``) end generation, as the model's generation config has them."""
    model = _tiny("glm4_moe_lite", GLM47_FLASH)
    path = write_deepseek2_gguf(model, tmp_path / "tiny-glm-4.7-flash.gguf", _quantised, mtp=True,
                                keys={"expert_gating_func": None}, token_ids={"eot_token_id": 90, "eom_token_id": 91})
    cfg = read_as_the_twin(path, model, IDS, file_own=("architecture",))  # read as DeepSeek's
    assert cfg.eos_token_ids == (2, 90, 91, 95) and cfg.num_layers == 3


@pytest.mark.parametrize(("keys", "named"), [
    ({"expert_gating_func": 1, "expert_group_count": 2, "expert_group_used_count": 1},
     "softmax routing over 2 expert groups is not served"),
    ({"expert_gating_func": 3}, "expert_gating_func 3 is not supported"),
    ({"rope.scaling.type": "linear"}, "rope scaling 'linear' is not supported"),
])
def test_what_llama_cpp_reads_otherwise_is_refused_by_name(tmp_path, keys, named):
    path = write_deepseek2_gguf(_tiny("deepseek_v3", V3), tmp_path / "tiny-deepseek.gguf", keys=keys)
    with pytest.raises(ModelLoadError, match=named):
        read_gguf_config(path)


def test_the_tokenizer_splits_text_as_deepseek_v3_s(tmp_path, monkeypatch, bundled_tokenizer):
    """transformers reads DeepSeek's GPT-2-style GGUF tokenizer as Qwen2's (``GGUF_TOKENIZER_AS``) but knows no
    ``deepseek-v3`` split: the file's is set after (``PRE_SPLITS``): digits in groups of up to three, a punctuation
    mark with the letters after it, runs of CJK apart (here with the bundled vocabulary)."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_bpe_tokenizer_gguf(tmp_path / "deepseek-tokenizer.gguf", "deepseek2", _TOKENIZER_KEYS, "deepseek-v3",
                                    bundled_tokenizer.hf)
    loaded = Tokenizer.load(path)
    pieces = [p for p, _ in loaded.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x12345!abc 日本語です")]
    assert pieces[:5] == ["x", "123", "45", "!abc", "Ġ"] and len(pieces) == 6, pieces  # then the CJK run, whole
    text = "DeepSeek-V3 says 1234567 in 日本語."
    assert loaded.decode(loaded.encode_plain(text)) == text
    v2 = write_bpe_tokenizer_gguf(tmp_path / "v2-tokenizer.gguf", "deepseek2", _TOKENIZER_KEYS, "deepseek-llm",
                                  bundled_tokenizer.hf)  # V2's and V2-Lite's: DeepSeek LLM's split, digit runs whole
    pieces = [p for p, _ in Tokenizer.load(v2).hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x12345!abc")]
    assert pieces == ["x", "12345", "!", "abc"], pieces


@pytest.mark.parametrize(("arch", "pre", "pieces", "bos"), [
    # Kimi K2's: a contraction kept with its word, runs of Han apart from kana and from the space before them
    ("deepseek2", "kimi-k2", ["It's", "ĠHTTPServer", "Ġ", "123", "45", "Ġ", "æĹ¥æľ¬èªŀ", "ãģ§ãģĻ"], True),
    # GLM's (GPT-4's cl100k; GLM-4.5's files here, GLM-4.7-Flash's deepseek2 ones read alike): the contraction apart,
    # a space with the letters after it, Han and kana together; and no BOS though the file asks for one (the template
    # writes [gMASK])
    ("glm4moe", "glm4", ["It", "'s", "ĠHTTPServer", "Ġ", "123", "45", "ĠæĹ¥æľ¬èªŀãģ§ãģĻ"], False)])
def test_kimi_k2_and_glm_tokenizers_split_text_as_their_own(tmp_path, monkeypatch, bundled_tokenizer, arch, pre,
                                                            pieces, bos):
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_bpe_tokenizer_gguf(tmp_path / f"{pre}.gguf", arch, _TOKENIZER_KEYS, pre, bundled_tokenizer.hf,
                                    add_bos=True)
    loaded = Tokenizer.load(path)
    split = loaded.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("It's HTTPServer 12345 日本語です")
    assert [p for p, _ in split] == pieces
    hello = bundled_tokenizer.hf("Hello", add_special_tokens=False)["input_ids"]
    assert loaded.hf("Hello")["input_ids"] == [1] * bos + hello
