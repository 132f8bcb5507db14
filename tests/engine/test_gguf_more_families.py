"""GGUF files of SmolLM3 (``smollm3``), Seed-OSS (``seed_oss``), OLMo 2 and OLMo 3 (``olmo2``), OLMoE (``olmoe``),
ERNIE 4.5 (``ernie4_5``, ``ernie4_5-moe``), MiniMax-M2 (``minimax-m2``) and dots.llm1 (``dots1``), written from tiny
transformers models the way llama.cpp's converters write them (SmolLM3's q/k rows permuted, its llama converter's
subclass; the others' as they are; each converter's own keys), load into the decoder whose float32 logits equal the
HF twin's; the config equals the one read from the model's ``config.json`` but where llama.cpp reads a file
otherwise (OLMoE's unrenormalised routing), torch-free alike; their tokenizers are read from the file's fields."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from services.engine.errors import ModelLoadError
from services.engine.model import ernie4_5
from services.engine.model.gguf_config import TENSOR_NAMES_KEY
from services.engine.model.registry import config_from_hf, model_class
from services.engine.weights import load_model_config, load_weights
from services.engine.weights.gguf_metadata import read_fields
from tests.engine.tiny_gguf import (
    all_f32,
    mixed,
    pdserve_logits,
    read_as_the_twin,
    tiny_hf,
    write_bpe_tokenizer_gguf,
    write_gguf,
    write_spm_tokenizer_gguf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
# betas that move the ramp of a 16-wide head at base 1e4 over 256 positions (32 and 1 put it elsewhere)
_YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256, "attention_factor": 1.25,
         "beta_fast": 8.0, "beta_slow": 2.0}
# (transformers overrides, the converter's keys beyond the generic ones); three layers where a pattern of layers shows
FAMILIES = {
    # SmolLM3: its file names no NoPE layers; llama.cpp leaves every fourth unrotated (layer 3 here), as released
    "smollm3": (dict(model_type="smollm3", num_hidden_layers=4, pad_token_id=0, tie_word_embeddings=True), {}),
    # Seed-OSS: q/k/v biases and an o_proj bias (the norm before the MLP named post_attention_norm)
    "seed_oss": (dict(model_type="seed_oss", head_dim=16, attention_out_bias=True, pad_token_id=0,
                      tie_word_embeddings=False), {}),
    "olmo2": (dict(model_type="olmo2", pad_token_id=0, tie_word_embeddings=False), {}),
    # OLMo 3: sliding (8 here, so the 45 tokens cross it), full, sliding; yarn on the full layer only, with its
    # attention factor and betas, as the converter's generic writer writes them
    "olmo3": (dict(model_type="olmo3", num_hidden_layers=3, sliding_window=8, pad_token_id=0,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"full_attention": {**_YARN, "rope_theta": 10000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                   tie_word_embeddings=False),
              {"attention.sliding_window": 8, "attention.sliding_window_pattern": [True, False, True],
               "rope.scaling.type": "yarn", "rope.scaling.factor": 2.0, "rope.scaling.original_context_length": 256,
               "rope.scaling.yarn_attn_factor": 1.25, "rope.scaling.yarn_beta_fast": 8.0,
               "rope.scaling.yarn_beta_slow": 2.0}),
    # EXAONE 4.0 32B's kind: per-head q/k norms, three sliding layers (8 here) and a global one without rope, the
    # pattern written as the converter writes it (one flag a layer)
    "exaone4": (dict(model_type="exaone4", num_hidden_layers=4, head_dim=16, sliding_window=8,
                     layer_types=["sliding_attention"] * 3 + ["full_attention"], tie_word_embeddings=False),
                {"attention.sliding_window": 8, "attention.sliding_window_pattern": [True, True, True, False]}),
    # Hunyuan dense: q/k normed after rope; the converter folds the NTK alpha into the base (float32 in the file)
    "hunyuan": (dict(model_type="hunyuan_v1_dense", head_dim=16, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0, "factor": 1.0}),
                {"rope.freq_base": 10000.0 * 1000.0 ** (16 / 14)}),
    # Hunyuan-A13B: the same layer with experts beside a shared MLP, both feed_forward_length wide as released
    "hunyuan_moe": (dict(model_type="hunyuan_v1_moe", head_dim=16, num_experts=4, moe_topk=2, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0,
                                          "factor": 1.0}),
                    {"rope.freq_base": 10000.0 * 1000.0 ** (16 / 14), "expert_count": 4, "expert_used_count": 2,
                     "expert_feed_forward_length": 96, "expert_shared_feed_forward_length": 96,
                     "expert_shared_count": 1}),
    # StarCoder2: LayerNorms with biases, biases on every projection, the tanh-GELU MLP; no window (llama.cpp's)
    "starcoder2": (dict(model_type="starcoder2", norm_epsilon=1e-5, tie_word_embeddings=True),
                   {"attention.layer_norm_epsilon": 1e-5, "attention.layer_norm_rms_epsilon": None}),
    # Nemotron: LayerNorm1P's weights stored as 1 + weight, rope on half of each head, biases everywhere; no key_length,
    # as its converter writes none where the checkpoint names no head_dim
    "nemotron": (dict(model_type="nemotron", head_dim=16, attention_bias=True, mlp_bias=True, norm_eps=1e-5,
                      tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                 {"attention.layer_norm_epsilon": 1e-5, "attention.layer_norm_rms_epsilon": None,
                  "rope.dimension_count": 8, "attention.key_length": None, "attention.value_length": None}),
    # Phi-2: attention and the MLP on one LayerNorm, biases everywhere (the head's too), rope on half of each head; no
    # key_length, as its converter writes none (the head is hidden / heads, not the rotated part)
    "phi": (dict(model_type="phi", num_key_value_heads=4, layer_norm_eps=1e-5, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
            {"attention.layer_norm_epsilon": 1e-5, "attention.layer_norm_rms_epsilon": None,
             "rope.dimension_count": 8, "attention.key_length": None, "attention.value_length": None}),
    "olmoe": (dict(model_type="olmoe", num_experts=4, num_experts_per_tok=2, pad_token_id=0,
                   tie_word_embeddings=False),
              {"expert_count": 4, "expert_used_count": 2}),
    "ernie4_5": (dict(model_type="ernie4_5", head_dim=16, tie_word_embeddings=True), {}),
    # ERNIE 4.5 MoE: a dense first layer, then experts on every second layer from it (layers 1 and 3 of 4), two
    # shared experts, the choice biased by the correction bias (drawn at random)
    "ernie4_5_moe": (dict(model_type="ernie4_5_moe", head_dim=16, num_hidden_layers=4, moe_num_experts=4, moe_k=2,
                          moe_intermediate_size=32, moe_num_shared_experts=2, moe_layer_start_index=1,
                          moe_layer_interval=2, intermediate_size=128, tie_word_embeddings=False),
                     {"expert_count": 4, "expert_used_count": 2, "interleave_moe_layer_step": 2,
                      "leading_dense_block_count": 1, "expert_feed_forward_length": 32, "expert_shared_count": 2,
                      "expert_shared_feed_forward_length": 128 // 2}),  # intermediate_size // kv heads, as written
    # dots.llm1: Qwen3's attention, a dense first layer, then sigmoid-routed experts (the correction bias drawn at
    # random) scaled by 2, renormalised, beside a shared one, as its Qwen2-MoE converter writes
    "dots1": (dict(model_type="dots1", head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.0,
                   tie_word_embeddings=False),
              {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
               "leading_dense_block_count": 1, "expert_shared_count": 1, "expert_weights_scale": 2.0,
               "expert_weights_norm": True, "expert_gating_func": 2}),
    # MiniMax-M2: q/k normed over all heads, rope on half of each head, sigmoid routing with its correction bias
    "minimax_m2": (dict(model_type="minimax_m2", head_dim=16, rotary_dim=8, num_local_experts=4, num_experts_per_tok=2,
                        tie_word_embeddings=False),
                   {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 96,
                    "rope.dimension_count": 8, "expert_gating_func": 2}),
}


def _model(name: str):
    overrides, _ = FAMILIES[name]
    model = tiny_hf(**overrides)
    with torch.no_grad():  # the routers' correction biases, which tiny_hf leaves at 0
        for param_name, param in model.named_parameters(remove_duplicate=False):
            if param_name.endswith("e_score_correction_bias"):
                param.copy_(0.3 * torch.randn_like(param))
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("e_score_correction_bias"):
                buffer.copy_(0.3 * torch.randn_like(buffer))
    return model


@pytest.mark.parametrize("quant", [all_f32, mixed], ids=["f32", "q8-q4-f16"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_file_of_the_family_gives_transformers_logits(name, quant, tmp_path):
    model = _model(name)
    path = write_gguf(model, tmp_path / f"tiny-{name}.gguf", quant, metadata=FAMILIES[name][1])
    cfg = read_as_the_twin(path, model, IDS, file_own=("rope_theta",) if name.startswith("hunyuan") else ())
    assert cfg.rope_theta == pytest.approx(config_from_hf(model.config.to_dict()).rope_theta, rel=1e-7)


@pytest.mark.parametrize("quant", [all_f32, mixed], ids=["f32", "q8-q4-f16"])
def test_a_phi2_file_with_fused_qkv_gives_transformers_logits(quant, tmp_path):
    """Older Phi-2 files (converted from ``mixer.Wqkv``) hold q, k and v stacked in ``attn_qkv`` with its bias."""
    model = _model("phi")
    path = write_gguf(model, tmp_path / "fused.gguf", quant, metadata=FAMILIES["phi"][1], fused_qkv=True)
    assert {"blk.0.attn_qkv.weight", "blk.0.attn_qkv.bias"} <= {t.name for t in GGUFReader(path).tensors}
    read_as_the_twin(path, model, IDS)


def test_the_families_read_what_llama_cpp_reads(tmp_path):
    """The layers each family's file gives its features: SmolLM3's NoPE layer, OLMo 3's windows and local rope, ERNIE
    4.5's sparse layers and shared width, MiniMax-M2's rotated part, Seed-OSS's biases from its tensors."""
    configs = {}
    for name in ("smollm3", "olmo3", "ernie4_5_moe", "minimax_m2", "seed_oss"):
        configs[name] = load_model_config(write_gguf(_model(name), tmp_path / f"{name}.gguf",
                                                     metadata=FAMILIES[name][1]))
    assert configs["smollm3"].nope_layers == (3,)
    olmo3 = configs["olmo3"]
    assert (olmo3.architecture, olmo3.layer_windows, olmo3.local_rope_layers) == ("olmo3", (8, None, 8), (0, 2))
    assert (olmo3.rope_scaling.attention_factor, olmo3.rope_scaling.beta_fast, olmo3.rope_scaling.beta_slow) == \
        (1.25, 8.0, 2.0)
    moe = configs["ernie4_5_moe"].moe
    assert (moe.sparse_layers, moe.shared_expert_intermediate_size, moe.biased_choice) == ((1, 3), 64, True)
    assert configs["minimax_m2"].rotary_dim == 8 and configs["minimax_m2"].moe.sigmoid_routing
    assert (configs["seed_oss"].qkv_bias, configs["seed_oss"].o_bias) == (True, True)


def test_exaone4_files_slide_as_their_keys_say(tmp_path):
    """The 32B's pattern as written; one without a pattern slides three layers of four (llama.cpp's); the 1.2B's,
    with no window, rotates every layer."""
    model = _model("exaone4")
    written = load_model_config(write_gguf(model, tmp_path / "a.gguf", metadata=FAMILIES["exaone4"][1]))
    assert (written.layer_windows, written.nope_layers, written.qk_norm) == ((8, 8, 8, None), (3,), True)
    keys = {**FAMILIES["exaone4"][1], "attention.sliding_window_pattern": None}
    assert load_model_config(write_gguf(model, tmp_path / "b.gguf", metadata=keys)).layer_windows == (8, 8, 8, None)
    keys = {**FAMILIES["exaone4"][1], "attention.sliding_window_pattern": [True, False, True, False]}
    assert load_model_config(write_gguf(model, tmp_path / "d.gguf", metadata=keys)).layer_windows == (8, None, 8, None)
    keys = {"attention.sliding_window": None, "attention.sliding_window_pattern": None}
    global_only = load_model_config(write_gguf(model, tmp_path / "c.gguf", metadata=keys))
    assert (global_only.layer_windows, global_only.nope_layers) == ((), ())
    fields = read_fields(GGUFReader(str(tmp_path / "c.gguf")))  # the 32B's 64 layers, no window named: 4096
    from services.engine.model import exaone4

    the_32b = exaone4.config_from_gguf(fields | {"exaone4.block_count": 64})
    assert the_32b.layer_windows[:4] == (4096, 4096, 4096, None) and len(the_32b.nope_layers) == 16


def test_an_olmo3_file_without_a_pattern_slides_three_layers_of_four(tmp_path):
    """llama.cpp's older OLMo 3 files name a window but no pattern: its runtime's period of 4 (the fourth full)."""
    overrides = {**FAMILIES["olmo3"][0], "num_hidden_layers": 4,
                 "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    keys = {**FAMILIES["olmo3"][1], "attention.sliding_window_pattern": None}
    cfg = load_model_config(write_gguf(tiny_hf(**overrides), tmp_path / "olmo3.gguf", metadata=keys))
    assert cfg.layer_windows == (8, 8, 8, None)


def test_a_yarn_attention_factor_written_as_attn_factor_is_read_too(tmp_path):
    """Older converters wrote the checkpoint's attention factor as ``rope.scaling.attn_factor`` (read first), newer ones
    as ``yarn_attn_factor``: either is the checkpoint's ``attention_factor``. (llama.cpp's runtime derives its own
    magnitude for most families and runs betas 32 and 1 whatever the file says; pdserve serves the checkpoint's.)"""
    keys = {**FAMILIES["olmo3"][1], "rope.scaling.yarn_attn_factor": None, "rope.scaling.attn_factor": 1.25}
    cfg = load_model_config(write_gguf(_model("olmo3"), tmp_path / "olmo3.gguf", metadata=keys))
    assert cfg.rope_scaling.attention_factor == 1.25


def test_a_minimax_m2_file_without_a_gating_key_routes_by_the_sigmoid(tmp_path):
    keys = {**FAMILIES["minimax_m2"][1], "expert_gating_func": None}
    cfg = load_model_config(write_gguf(_model("minimax_m2"), tmp_path / "m2.gguf", metadata=keys))
    assert cfg.moe.sigmoid_routing


def test_an_olmo3_pattern_of_another_length_is_refused(tmp_path):
    keys = {**FAMILIES["olmo3"][1], "attention.sliding_window_pattern": [True, False]}
    with pytest.raises(ModelLoadError, match="sliding_window_pattern lists 2 layers"):
        load_model_config(write_gguf(_model("olmo3"), tmp_path / "olmo3.gguf", metadata=keys))


def test_an_olmoe_file_routes_unrenormalised_as_llama_cpp_does(tmp_path):
    """llama.cpp never renormalises OLMoE's chosen weights: a file of a checkpoint that said to is served as
    llama.cpp serves it (the config says so), not as its checkpoint."""
    model = tiny_hf(**{**FAMILIES["olmoe"][0], "norm_topk_prob": True})
    cfg = load_model_config(write_gguf(model, tmp_path / "olmoe.gguf", metadata=FAMILIES["olmoe"][1]))
    assert not cfg.moe.norm_topk_prob


def test_a_minimax_m2_file_with_softmax_routing_is_refused(tmp_path):
    keys = {**FAMILIES["minimax_m2"][1], "expert_gating_func": 1}
    with pytest.raises(ModelLoadError, match="expert_gating_func 1"):
        load_model_config(write_gguf(_model("minimax_m2"), tmp_path / "m2.gguf", metadata=keys))


def test_an_ernie_file_without_a_correction_bias_routes_by_the_softmax(tmp_path):
    """llama.cpp's ERNIE loader takes ``exp_probs_b`` as optional: without it the choice is the softmax's."""
    model = _model("ernie4_5_moe")
    cfg = load_model_config(write_gguf(model, tmp_path / "ernie.gguf", metadata=FAMILIES["ernie4_5_moe"][1]))
    assert cfg.moe.biased_choice
    stripped = dataclasses.replace(cfg.moe, biased_choice=False)
    fields = read_fields(GGUFReader(str(tmp_path / "ernie.gguf")))
    fields[TENSOR_NAMES_KEY] = tuple(n for n in fields[TENSOR_NAMES_KEY] if "exp_probs_b" not in n)
    assert ernie4_5.config_from_gguf(fields).moe == stripped


@pytest.mark.parametrize(("arch", "pre", "text", "pieces"), [
    ("smollm3", "llama-bpe", "SmolLM3 runs 12345 here.", ["SmolLM", "3", "Ġruns", "Ġ", "123", "45"]),
    ("olmo2", "dbrx", "OLMo 3 counts 12345.", ["OLMo", "Ġ", "3", "Ġcounts", "Ġ", "123", "45", "."]),
    ("olmoe", "olmo", "OLMoE counts 12345!", ["OLMoE", "Ġcounts", "Ġ12345", "!"]),
    ("seed_oss", "seed-coder", "Seed 12345 x!!\n\ny", ["Seed", "Ġ", "1", "2", "3", "4", "5", "Ġx", "!!", "ĊĊ", "y"]),
    ("qwen3next", "qwen2", "Qwen3 counts 12345.", ["Qwen", "3", "Ġcounts", "Ġ", "1", "2", "3", "4", "5", "."]),
    ("granitehybrid", "dbrx", "Granite 4.0 counts 12345.", ["Granite", "Ġ", "4", ".", "0", "Ġcounts", "Ġ", "123"]),
    ("nemotron_h", "pixtral", "NemotronH counts 12345.", ["NemotronH", "Ġcounts", "Ġ", "123", "45", "."]),
    ("nemotron_h_moe", "pixtral", "Nemotron 3 counts 12345.", ["Nemotron", "Ġ", "3", "Ġcounts", "Ġ", "123", "45"]),
    ("command-r", "command-r", "Command R counts 12345.", ["Command", "ĠR", "Ġcounts", "Ġ", "1", "2", "3", "4", "5"]),
    ("cohere2", "command-r", "Command A: 12.", ["Command", "ĠA", ":", "Ġ", "1", "2", "."]),
    ("exaone4", "exaone4", "EXAONE 4.0 counts 12345.", ["EXAONE", "Ġ4", ".", "0", "Ġcounts", "Ġ12345", "."]),
    ("exaone", "exaone", "EXAONE 3.5 counts 12.", ["EXAONE", "Ġ", "3", ".", "5", "Ġcounts", "Ġ", "1", "2", "."]),
    ("hunyuan-dense", "hunyuan-dense", "Hunyuan counts 12345.", ["Hunyuan", "Ġcounts", "Ġ", "123", "45", "."]),
    ("hunyuan-moe", "hunyuan", "Hunyuan-A13B 12.", ["Hunyuan", "-A", "1", "3", "B", "Ġ", "1", "2", "."]),
    ("starcoder2", "starcoder", "StarCoder2 counts 12.", ["StarCoder", "2", "Ġcounts", "Ġ", "1", "2", "."]),
    ("phi2", "phi-2", "Phi-2 counts 12345.", ["Phi", "-", "2", "Ġcounts", "Ġ12345", "."]),
    ("mamba", "olmo", "Mamba counts 12345.", None),  # state-spaces' GPT-NeoX vocabulary
    ("mamba", "falcon", "Falcon-Mamba counts 12.", None),
])
def test_the_tokenizer_is_read_from_the_file_s_fields(tmp_path, monkeypatch, bundled_tokenizer, arch, pre, text,
                                                       pieces):
    """transformers reads no such GGUF config: the tokenizer is built from the file's fields, split as its
    ``tokenizer.ggml.pre`` says."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5}
    path = write_bpe_tokenizer_gguf(tmp_path / f"{arch}-tokenizer.gguf", arch, keys, pre, bundled_tokenizer.hf)
    loaded = Tokenizer.load(path)
    assert loaded.decode(loaded.encode_plain(text)) == text
    split = [p for p, _ in loaded.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    if pieces is not None:
        assert split[:len(pieces)] == pieces, split


@pytest.mark.parametrize(("add_space_prefix", "pieces"), [(True, ["▁Hello", "▁world"]), (False, ["Hello", "▁world"])])
def test_ernie_s_sentencepiece_vocabulary_prefixes_a_space_as_its_file_says(tmp_path, monkeypatch, add_space_prefix,
                                                                             pieces):
    """ERNIE 4.5's files hold a sentencepiece vocabulary (pre ``default``, which splits nothing: not refused);
    ``add_space_prefix`` says whether a ``▁`` starts the text, as llama.cpp reads it."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5}
    vocabulary = ["▁", "H", "e", "l", "o", "w", "r", "d", "ll", "He", "llo", "Hello", "▁Hello", "or", "ld", "▁w",
                  "▁wor", "▁world"]
    path = write_spm_tokenizer_gguf(tmp_path / f"ernie-{add_space_prefix}.gguf", "ernie4_5", keys, vocabulary,
                                    add_space_prefix)
    loaded = Tokenizer.load(path)
    ids = loaded.encode_plain("Hello world")
    assert [loaded.hf.convert_ids_to_tokens(i) for i in ids] == pieces
    assert loaded.decode(ids) == "Hello world"


def test_an_unknown_split_of_a_new_family_is_refused_by_name(tmp_path, monkeypatch, bundled_tokenizer):
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5}
    path = write_bpe_tokenizer_gguf(tmp_path / "olmo2-superbpe.gguf", "olmo2", keys, "superbpe", bundled_tokenizer.hf)
    with pytest.raises(ValueError, match="splits text as 'superbpe'"):
        Tokenizer.load(path)


def test_the_new_families_end_a_chat_turn_at_im_end(tmp_path):
    """SmolLM3's and OLMo 3's ChatML turns end at ``<|im_end|>`` (their files' EOS may be the end of text)."""
    tokens = [f"<t{i}>" for i in range(96)]
    tokens[7] = "<|im_end|>"
    for name in ("smollm3", "olmo2"):
        cfg = load_model_config(write_gguf(_model(name), tmp_path / f"{name}-ends.gguf", tokens=tokens,
                                           metadata=FAMILIES[name][1]))
        assert cfg.eos_token_ids == (2, 7), (name, cfg.eos_token_ids)


def test_the_written_olmo3_twin_is_not_trivially_equal(tmp_path):
    """The sliding window and each of yarn's betas move the logits here, so the twin check sees a misread one."""
    model = _model("olmo3")
    path = write_gguf(model, tmp_path / "olmo3.gguf", metadata=FAMILIES["olmo3"][1])
    cfg = read_as_the_twin(path, model, IDS)
    weights = load_weights(path)
    exact = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    scaling = cfg.rope_scaling
    for wrong in (dataclasses.replace(cfg, layer_windows=(None, None, None), local_rope_layers=()),
                  dataclasses.replace(cfg, rope_scaling=dataclasses.replace(scaling, beta_fast=32.0)),
                  dataclasses.replace(cfg, rope_scaling=dataclasses.replace(scaling, beta_slow=1.0))):
        off = pdserve_logits(model_class(cfg.architecture)(wrong, load_weights(path).tensors, torch.float32), IDS)
        assert not np.allclose(off.numpy(), exact.numpy(), atol=1e-3)


@pytest.mark.parametrize("arch", ["gemma", "nemotron", "jamba", "mamba2"])
def test_gemma_s_nemotron_s_jamba_s_and_mamba2_s_sentencepiece_vocabularies_are_read(tmp_path, monkeypatch, arch):
    """A Gemma 1 file's vocabulary (``gemma``: transformers reads no such architecture by name) is read as Gemma 2's,
    whose converter writes the same fields; Nemotron's, Jamba's and Mamba-Codestral's (``mamba2``) from the file's
    fields (here without a space prefix, as the file says: transformers' own reader would prefix one; Jamba's converter
    writes none for its tokenizer.json vocabularies)."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    keys = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
            "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5}
    vocabulary = ["▁", "H", "e", "l", "o", "w", "r", "d", "ll", "He", "llo", "Hello", "▁Hello", "or", "ld", "▁w",
                  "▁wor", "▁world"]
    path = write_spm_tokenizer_gguf(tmp_path / f"{arch}.gguf", arch, keys, vocabulary, add_space_prefix=False)
    loaded = Tokenizer.load(path)
    ids = loaded.encode_plain("Hello world")
    assert [loaded.hf.convert_ids_to_tokens(i) for i in ids] == ["Hello", "▁world"]
    assert loaded.decode(ids) == "Hello world"
