"""The text model of Qwen's vision-language checkpoints, from configs shaped like the released ones (Qwen2.5-VL-7B's
first, flat file with ``{"type": "mrope"}``, Qwen3-VL-8B's and Qwen3-VL-30B-A3B's nested ones): read as the text
family transformers builds, M-RoPE as the plain rope a text token sees; their tensor names; a head the config ties
but the checkpoint stores apart stays untied, as transformers loads it. The family test serves the tiny checkpoints
exactly (tests/engine/test_model_families.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engine.model.multimodal_text import text_tensor_name
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights

QWEN2_5_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 152064,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "hidden_size": 1280, "out_hidden_size": 3584, "fullatt_block_indexes": [7, 15]},
}
_QWEN3_VL_TEXT = {"attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
                  "hidden_act": "silu", "max_position_embeddings": 262144, "num_attention_heads": 32,
                  "rms_norm_eps": 1e-06, "rope_theta": 5000000, "vocab_size": 151936,
                  "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"}}
QWEN3_VL_8B = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "tie_word_embeddings": False,
    "text_config": _QWEN3_VL_TEXT | {"model_type": "qwen3_vl_text", "hidden_size": 4096, "intermediate_size": 12288,
                                     "num_hidden_layers": 36, "num_key_value_heads": 8},
    "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 4096},
}
QWEN3_VL_30B_A3B = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
    "tie_word_embeddings": False,
    "text_config": _QWEN3_VL_TEXT | {"model_type": "qwen3_vl_moe_text", "hidden_size": 2048, "intermediate_size": 6144,
                                     "num_hidden_layers": 48, "num_key_value_heads": 4, "num_experts": 128,
                                     "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                                     "mlp_only_layers": []},
    "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 2048},
}


def test_qwen2_5_vl_s_flat_file_is_qwen2_with_plain_rope():
    cfg = config_from_hf(QWEN2_5_VL_7B)
    assert cfg.architecture == "qwen_vl" and (cfg.hidden_size, cfg.num_layers, cfg.head_dim) == (3584, 28, 128)
    assert cfg.qkv_bias and not cfg.qk_norm and cfg.rope_scaling is None and cfg.rope_theta == 1e6
    assert not cfg.layer_windows and not cfg.tie_word_embeddings and cfg.eos_token_ids == (151645,)


def test_qwen3_vl_is_qwen3_and_its_moe_qwen3_moe_renormalised():
    dense = config_from_hf(QWEN3_VL_8B)
    assert dense.architecture == "qwen_vl" and dense.qk_norm and not dense.qkv_bias and dense.moe is None
    assert (dense.num_layers, dense.num_kv_heads, dense.rope_theta, dense.max_position) == (36, 8, 5e6, 262144)
    assert dense.rope_scaling is None and not dense.tie_word_embeddings
    sparse = config_from_hf(QWEN3_VL_30B_A3B).moe
    assert (sparse.num_experts, sparse.top_k, sparse.intermediate_size) == (128, 8, 768)
    assert sparse.sparse_layers == tuple(range(48)) and sparse.norm_topk_prob  # its router always renormalises


@pytest.mark.parametrize(("config", "top", "text", "tied"), [
    (QWEN3_VL_8B, True, False, True), (QWEN3_VL_8B, False, False, False), (QWEN3_VL_8B, None, None, False),
    (QWEN3_VL_8B, False, True, True),  # a stored head that differs stays untied all the same (the loader's rule)
    (QWEN3_VL_30B_A3B, None, None, True),  # Qwen3VLMoeConfig's default
    (QWEN2_5_VL_7B | {"text_config": {k: v for k, v in QWEN2_5_VL_7B.items() if k != "vision_config"}},
     False, True, True),  # transformers' own rule for the 2.5's first files: the text config's true wins
])
def test_tied_where_the_top_level_or_its_default_or_the_text_config_says_so(config, top, text, tied):
    """With the loader keeping a stored head that differs untied, the only failure left would be a headless
    checkpoint read untied: so a wrapper is tied where any reading of transformers' would tie it."""
    config = {k: v for k, v in config.items() if k != "tie_word_embeddings"} | (
        {} if top is None else {"tie_word_embeddings": top})
    config["text_config"] = {k: v for k, v in config["text_config"].items() if k != "tie_word_embeddings"} | (
        {} if text is None else {"tie_word_embeddings": text})
    assert config_from_hf(config).tie_word_embeddings is tied


def test_the_text_model_s_names_in_both_layouts():
    assert text_tensor_name("model.language_model.layers.0.mlp.experts.gate_up_proj") == \
        "model.layers.0.mlp.experts.gate_up_proj"
    assert text_tensor_name("model.layers.0.self_attn.q_proj.bias") == "model.layers.0.self_attn.q_proj.bias"
    for vision in ("visual.blocks.0.attn.qkv.weight", "model.visual.merger.mlp.0.weight",
                   "model.visual.deepstack_merger_list.0.norm.weight"):
        assert text_tensor_name(vision) is None


def test_a_head_the_config_ties_but_the_checkpoint_stores_apart_stays_untied(family_dir, tmp_path):
    """transformers keeps both (untied) when a checkpoint stores a head that differs from its embeddings, whatever
    the flag says; one equal to them is the tied head."""
    path = shutil.copytree(family_dir("qwen_vl"), tmp_path / "qwen_vl")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    loaded = load_weights(path)
    assert not loaded.config.tie_word_embeddings and "lm_head.weight" in loaded.tensors
    for file in path.glob("*.safetensors"):  # now store the embeddings as the head
        tensors = load_file(str(file))
        if "lm_head.weight" in tensors:
            embed = next(load_file(str(f))["model.language_model.embed_tokens.weight"]
                         for f in path.glob("*.safetensors")
                         if "model.language_model.embed_tokens.weight" in load_file(str(f)))
            tensors["lm_head.weight"] = embed.clone()
            save_file(tensors, str(file), metadata={"format": "pt"})
    loaded = load_weights(path)
    assert loaded.config.tie_word_embeddings and "lm_head.weight" not in loaded.tensors
    assert torch.equal(loaded.tensors["model.embed_tokens.weight"], embed)


def test_mistral_s_own_format_copy_is_neither_read_nor_hashed(family_dir, tmp_path):
    """Mistral's repositories ship ``consolidated.safetensors`` (the same weights under Mistral's names) beside the
    Hugging Face files: the loader reads the index's shards, or every file but that one, and the digest hashes the
    same files (for Mistral Small 3.1, 48 GB less to read at every start)."""
    from services.engine.weights.digest import weights_digest

    path = shutil.copytree(family_dir("mistral3-text"), tmp_path / "mistral")
    digest = weights_digest(path)
    save_file({"layers.0.attention.wq.weight": torch.zeros(2, 2)}, str(path / "consolidated.safetensors"))
    assert weights_digest(path) == digest and "layers.0.attention.wq.weight" not in load_weights(path).tensors
    (path / "model.safetensors.index.json").unlink()  # no index: every file but Mistral's own
    assert weights_digest(path) == digest  # the same shards, the same bytes
    loaded = load_weights(path)
    assert "model.embed_tokens.weight" in loaded.tensors and "layers.0.attention.wq.weight" not in loaded.tensors
