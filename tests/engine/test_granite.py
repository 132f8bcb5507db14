"""IBM Granite 3.x beyond the family test's float32 greedy parity: the published config reads into its four
scalars; llama.cpp's files too, a missing scale being no scaling (the attention's: head_dim ** -0.5); and the
scalars are what makes the parity (the same weights as plain Llama give other tokens)."""

from __future__ import annotations

import dataclasses

from services.engine.model.registry import config_from_gguf, config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import NEW_TOKENS, _prompts, greedy_tokens
from tests.engine.tiny_families import greedy_full_forward, load_reference

# ibm-granite/granite-3.1-8b-instruct's config.json, as published
GRANITE_31_8B = {
    "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
    "attention_multiplier": 0.0078125, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12800,
    "logits_scaling": 16.0, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "granite",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000000.0,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 49155,
}


def test_the_published_config_reads_its_four_scalars():
    cfg = config_from_hf(GRANITE_31_8B)
    assert (cfg.architecture, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("granite", 4096, 40, 32, 8, 128)
    scalars = cfg.multipliers
    assert (scalars.embedding, scalars.attention, scalars.residual, scalars.logits_divisor) == \
        (12.0, 0.0078125, 0.22, 16.0)
    assert cfg.rope_theta == 1e7 and cfg.tie_word_embeddings and cfg.max_position == 131072
    defaults = config_from_hf({k: v for k, v in GRANITE_31_8B.items() if not k.endswith(("multiplier", "scaling"))})
    assert defaults.multipliers == dataclasses.replace(scalars, embedding=1.0, attention=1.0, residual=1.0,
                                                       logits_divisor=1.0)  # transformers' defaults: all 1.0
    nulls = config_from_hf(GRANITE_31_8B | {"embedding_multiplier": None, "logits_scaling": None})
    assert (nulls.multipliers.embedding, nulls.multipliers.logits_divisor) == (1.0, 1.0)


def test_a_llama_cpp_file_reads_its_scales_and_a_missing_one_is_no_scaling():
    fields = {"general.architecture": "granite", "granite.block_count": 40, "granite.context_length": 131072,
              "granite.embedding_length": 4096, "granite.feed_forward_length": 12800,
              "granite.attention.head_count": 32, "granite.attention.head_count_kv": 8,
              "granite.attention.layer_norm_rms_epsilon": 1e-5, "granite.rope.freq_base": 1e7,
              "granite.embedding_scale": 12.0, "granite.residual_scale": 0.22, "granite.attention.scale": 0.0078125,
              "granite.logit_scale": 16.0, "tokenizer.ggml.eos_token_id": 0, "pdserve.derived_vocab_size": 49155}
    cfg = config_from_gguf(fields)
    assert cfg.architecture == "granite" and cfg.multipliers.attention == 0.0078125
    assert (cfg.multipliers.embedding, cfg.multipliers.residual, cfg.multipliers.logits_divisor) == (12.0, 0.22, 16.0)
    bare = config_from_gguf({k: v for k, v in fields.items() if "scale" not in k})
    assert bare.multipliers.attention is None and bare.multipliers.embedding == 1.0  # head_dim ** -0.5 then


def test_the_scalars_are_what_makes_it_exact(family_dir, bundled_tokenizer):
    path = family_dir("granite")
    weights = load_weights(path)
    prompt = _prompts()["long"]
    expected = greedy_full_forward(load_reference(path), prompt, NEW_TOKENS).token_ids
    assert greedy_tokens(weights, weights.config, bundled_tokenizer, prompt) == expected
    as_llama = dataclasses.replace(weights.config, multipliers=None)
    assert greedy_tokens(weights, as_llama, bundled_tokenizer, prompt) != expected


def test_a_llama_cpp_file_s_tokenizer_reads_as_llama_s(tmp_path, monkeypatch, bundled_model_path, bundled_tokenizer):
    """transformers' GGUF reader does not know ``granite`` by name; its tokenizer fields are llama's kind (the
    bundled model's, here, under a granite header), and read as such they give the same tokens."""
    import gguf
    import numpy as np

    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    source = gguf.GGUFReader(str(bundled_model_path))
    path = tmp_path / "granite.gguf"
    writer = gguf.GGUFWriter(str(path), "granite")
    for key, field in source.fields.items():
        if key.startswith("tokenizer.ggml."):
            kind = field.types[0]
            writer.add_key_value(key, field.contents(), kind,
                                 sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for key, value in {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
                       "attention.head_count": 1}.items():
        writer.add_uint32(f"granite.{key}", value)
    writer.add_float32("granite.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tokenizer = Tokenizer.load(path)
    text = "Granite reads its tokenizer: naïve café, 12345."
    assert tokenizer.vocab_size == bundled_tokenizer.vocab_size
    assert tokenizer.hf.encode(text) == bundled_tokenizer.hf.encode(text)
