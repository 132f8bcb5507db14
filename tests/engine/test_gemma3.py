"""Gemma 3 beyond the family test's float32 greedy parity: Google's config files (which leave most fields to
transformers' defaults) read into the right windows, rope bases and scalars; what pdserve does not serve is
refused by name; bf16 logits track transformers' bf16 model; the attention backend is one that has windows."""

from __future__ import annotations

import pytest
import torch

from kernels.attention import AttentionMetadata, TorchPagedAttention
from services.engine.config import EngineConfig
from services.engine.decode_graphs import graph_support
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.model.gguf_config import TURN_END_KEY
from services.engine.model.multimodal_text import text_tensor_name
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights

# google/gemma-3-1b-it's config.json, as published
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
    "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
    "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144,
}
# google/gemma-3-4b-it's config.json (vision_config shortened): the text model's fields mostly left out
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "model_type": "siglip_vision_model"},
}


def test_the_1b_config_reads_as_transformers_defines_it():
    cfg = config_from_hf(GEMMA3_1B)
    assert (cfg.architecture, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("gemma3", 1152, 4, 1, 256)
    assert cfg.layer_windows == tuple(None if (i + 1) % 6 == 0 else 512 for i in range(26))
    assert cfg.max_position == 32768  # not capped at the window: the sliding layers are served exactly
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling is None
    assert cfg.gemma.local_rope_theta == 1e4 and cfg.gemma.query_pre_attn_scalar == 256
    assert cfg.gemma.final_logit_softcap is None and cfg.qk_norm and cfg.tie_word_embeddings
    assert cfg.eos_token_ids == (1, 106) and cfg.bos_token_id == 2


def test_the_4b_multimodal_config_reads_its_text_model_with_the_defaults():
    cfg = config_from_hf(GEMMA3_4B)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == \
        (2560, 34, 8, 4, 256, 262208)
    assert cfg.rope_scaling.rope_type == "linear" and cfg.rope_scaling.factor == 8.0
    assert cfg.gemma.local_rope_theta == 1e4 and cfg.max_position == 131072
    assert sum(w is None for w in cfg.layer_windows) == 5 and set(cfg.layer_windows) == {None, 1024}
    assert cfg.eos_token_ids == (1, 106)


@pytest.mark.parametrize(("change", "named"), [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"hidden_activation": "silu"}, "hidden_activation 'silu'"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"sliding_window": None}, "sliding_window is null"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(GEMMA3_1B | change)


def test_multimodal_tensor_names_map_to_the_text_model_and_the_vision_tower_is_not_read():
    assert text_tensor_name("language_model.model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp.up_proj.weight"
    assert text_tensor_name("model.language_model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert text_tensor_name("language_model.lm_head.weight") == "lm_head.weight"
    assert text_tensor_name("model.norm.weight") == "model.norm.weight"
    for name in ("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
                 "multi_modal_projector.mm_input_projection_weight", "model.vision_tower.x",
                 "model.multi_modal_projector.y"):
        assert text_tensor_name(name) is None


def _engine(path, **overrides) -> LLMEngine:
    settings = dict(model_path=str(path), dtype="float32", num_kv_blocks=64)
    return LLMEngine.from_config(EngineConfig(**(settings | overrides)))


def test_auto_attention_takes_a_backend_with_windows_and_graphs_stay_off(family_dir):
    engine = _engine(family_dir("gemma3"))
    assert engine.runner.attention.supports_window
    assert engine.runner.attention.name in ("cpu_native", "torch")  # torch where the kernel does not build
    assert "sliding-window" in graph_support(engine.model)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"attention_backend": "cpu_fixed_order"}, "'cpu_fixed_order' has no sliding-window attention"),
    ({"deterministic": True}, "deterministic mode's attention"),
])
def test_a_backend_without_windows_is_refused_by_name(family_dir, overrides, named):
    with pytest.raises(ValueError, match=named):
        _engine(family_dir("gemma3"), **overrides)


def test_served_no_longer_than_its_window_the_sliding_layers_keep_their_own_rope(family_dir):
    """At a context no longer than the window (24 here) serving drops the windows, which then hide nothing; the
    sliding layers must still rotate with their own base (10000, not the full layers' scaled 1e6): transformers'
    logits. (They took the full layers' rope before.)"""
    from services.engine.model.gemma_decoder import GemmaDecoderModel
    from tests.engine.tiny_families import load_reference
    from tests.engine.tiny_gguf import hf_logits, pdserve_logits

    path = family_dir("gemma3")
    assert not _engine(path, max_model_len=24).model.config.has_windows
    weights = load_weights(path)
    config = weights.config.served_within(24)
    assert not config.has_windows and config.local_rope_layers == (0, 2)
    prompt = [(i * 7919) % 49000 + 17 for i in range(20)]
    logits = pdserve_logits(GemmaDecoderModel(config, weights.tensors, torch.float32), prompt)
    assert torch.allclose(logits, hf_logits(load_reference(path), prompt), atol=1e-4, rtol=1e-4)


def test_float16_is_refused(family_dir):
    with pytest.raises(ModelLoadError, match="float16"):
        _engine(family_dir("gemma3"), dtype="float16")


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("name", ["gemma3", "gemma3-multimodal"])
@torch.inference_mode()
def test_logits_track_transformers_in_both_dtypes(family_dir, name, dtype, tolerance):
    """A 60-token prompt (past the window of 24) in one prefill: the logits of every position against
    transformers' forward of the same weights loaded in the same dtype (the greedy parity of the family test
    cannot see the softcap, which keeps the order of the logits)."""
    from transformers import AutoModelForCausalLM

    from services.engine.model.gemma_decoder import GemmaDecoderModel

    path = family_dir(name)
    weights = load_weights(path)
    model = GemmaDecoderModel(weights.config, weights.tensors, dtype)
    reference = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    prompt = [(i * 7919) % 49000 + 17 for i in range(60)]
    expected = reference(input_ids=torch.tensor([prompt])).logits[0].float()
    cfg, block_size = weights.config, 16
    kv = [torch.zeros(8, 2, block_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype) for _ in range(cfg.num_layers)]
    attention = TorchPagedAttention("cpu")
    attention.plan(AttentionMetadata.build([60], [60], [[0, 1, 2, 3]], block_size, "cpu"))
    logits = model.forward(torch.tensor(prompt), torch.arange(60), kv, attention, torch.arange(60))
    error = ((logits - expected).abs().amax(-1) / expected.abs().amax(-1)).max()
    assert error < tolerance, f"{dtype} logits differ from transformers' by {error:.2e} of their range"


def _gguf_fields(**overrides):
    """llama.cpp's metadata of google/gemma-3-27b-it's GGUF (the keys its converter writes)."""
    fields = {"general.architecture": "gemma3", "general.name": "Gemma 3 27b It", "gemma3.block_count": 62,
              "gemma3.context_length": 131072, "gemma3.embedding_length": 5376, "gemma3.feed_forward_length": 21504,
              "gemma3.attention.head_count": 32, "gemma3.attention.head_count_kv": 16,
              "gemma3.attention.key_length": 128, "gemma3.attention.value_length": 128,
              "gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.rope.freq_base": 1e6,
              "gemma3.attention.sliding_window": 1024, "gemma3.rope.scaling.type": "linear",
              "gemma3.rope.scaling.factor": 8.0, "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
              "tokenizer.ggml.eot_token_id": 106, "pdserve.derived_vocab_size": 262208}
    return {key: value for key, value in {**fields, **overrides}.items() if value is not None}


def test_a_llama_cpp_file_reads_as_llama_cpp_reads_it():
    from services.engine.model.registry import config_from_gguf

    cfg = config_from_gguf(_gguf_fields())
    assert cfg.gemma.query_pre_attn_scalar == 5376 // 32 == 168  # the 27B's, as llama.cpp hardcodes it
    assert cfg.layer_windows == tuple(None if (i + 1) % 6 == 0 else 1024 for i in range(62))
    assert cfg.rope_scaling.rope_type == "linear" and cfg.gemma.local_rope_theta == 1e4
    assert cfg.eos_token_ids == (1, 106)  # <end_of_turn> ends a chat turn
    smaller = config_from_gguf(_gguf_fields(**{"gemma3.block_count": 34, "gemma3.embedding_length": 2560,
                                               "gemma3.attention.head_count": 8, "gemma3.attention.head_count_kv": 4,
                                               "gemma3.attention.key_length": 256}))
    assert smaller.gemma.query_pre_attn_scalar == 256  # head_dim
    assert not config_from_gguf(_gguf_fields(**{"gemma3.attention.sliding_window": None})).has_windows
    assert not config_from_gguf(_gguf_fields(**{"gemma3.attention.sliding_window": 0})).has_windows
    # a file without eot_token_id: <end_of_turn> found by its text (the loader's derived key), as llama.cpp does
    found = config_from_gguf(_gguf_fields(**{"tokenizer.ggml.eot_token_id": None,
                                             TURN_END_KEY: (106,)}))
    assert found.eos_token_ids == (1, 106)
