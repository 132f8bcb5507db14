"""Gemma 2 beyond the family test's float32 greedy parity: Google's config files read into the right windows,
scalars and softcaps; llama.cpp's files as llama.cpp reads them; what pdserve does not serve is refused by
name; the logits track transformers' in both dtypes, and the attention softcap is what makes them; the
attention backend is one that takes a softcap (the deterministic mode's and CUDA graphs' do not)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from kernels.attention import AttentionMetadata, TorchPagedAttention
from services.engine.config import EngineConfig
from services.engine.decode_graphs import graph_support
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_gguf, config_from_hf
from services.engine.weights import load_weights

# google/gemma-2-9b-it's config.json, as published (before transformers had layer_types)
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "sliding_window_size": 4096,
    "torch_dtype": "float32", "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 256000,
}
# google/gemma-2-27b-it's shape: queries scaled by hidden / heads (144), not by head_dim (128)
GEMMA2_27B = GEMMA2_9B | {"hidden_size": 4608, "intermediate_size": 36864, "num_attention_heads": 32,
                          "num_hidden_layers": 46, "num_key_value_heads": 16, "head_dim": 128,
                          "query_pre_attn_scalar": 144}


def test_the_9b_config_reads_as_transformers_defines_it():
    cfg = config_from_hf(GEMMA2_9B)
    assert (cfg.architecture, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers) == \
        ("gemma2", 3584, 16, 8, 256, 42)
    assert cfg.layer_windows == tuple(4096 if i % 2 == 0 else None for i in range(42))  # from the first layer
    assert cfg.max_position == 8192 and cfg.rope_theta == 1e4 and cfg.rope_scaling is None
    assert cfg.gemma.local_rope_theta == 1e4 and cfg.gemma.query_pre_attn_scalar == 256
    assert cfg.attn_logit_softcap == 50.0 and cfg.gemma.final_logit_softcap == 30.0
    assert not cfg.qk_norm and cfg.tie_word_embeddings
    assert cfg.eos_token_ids == (1, 107) and cfg.bos_token_id == 2
    assert config_from_hf(GEMMA2_27B).gemma.query_pre_attn_scalar == 144
    # a context no longer than the window: served without windows (every layer full attention then)
    assert not cfg.served_within(4096).has_windows and cfg.served_within(4097).has_windows


@pytest.mark.parametrize(("change", "named"), [
    ({"hidden_activation": "silu"}, "hidden_activation 'silu'"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope scaling"),
    ({"attn_logit_softcapping": -1.0}, "softcap must be > 0"),
    ({"sliding_window": None}, "sliding_window is null"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(GEMMA2_9B | change)


def test_a_config_without_softcaps_has_none():
    cfg = config_from_hf(GEMMA2_9B | {"attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert cfg.attn_logit_softcap is None and cfg.gemma.final_logit_softcap is None


def _gguf_fields(**overrides):
    """llama.cpp's metadata of google/gemma-2-27b-it's GGUF (the keys its converter writes)."""
    fields = {"general.architecture": "gemma2", "general.name": "Gemma 2 27b It", "gemma2.block_count": 46,
              "gemma2.context_length": 8192, "gemma2.embedding_length": 4608, "gemma2.feed_forward_length": 36864,
              "gemma2.attention.head_count": 32, "gemma2.attention.head_count_kv": 16,
              "gemma2.attention.key_length": 128, "gemma2.attention.value_length": 128,
              "gemma2.attention.layer_norm_rms_epsilon": 1e-6, "gemma2.attention.sliding_window": 4096,
              "gemma2.attn_logit_softcapping": 50.0, "gemma2.final_logit_softcapping": 30.0,
              "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.eot_token_id": 107,
              "pdserve.derived_vocab_size": 256000}
    return {key: value for key, value in {**fields, **overrides}.items() if value is not None}


def test_a_llama_cpp_file_reads_as_llama_cpp_reads_it():
    cfg = config_from_gguf(_gguf_fields())
    assert cfg.architecture == "gemma2" and cfg.gemma.query_pre_attn_scalar == 4608 // 32 == 144  # the 27B's
    assert cfg.layer_windows == tuple(4096 if i % 2 == 0 else None for i in range(46))
    assert cfg.attn_logit_softcap == 50.0 and cfg.gemma.final_logit_softcap == 30.0 and not cfg.qk_norm
    assert cfg.eos_token_ids == (1, 107) and cfg.gemma.local_rope_theta == cfg.rope_theta == 1e4
    smaller = config_from_gguf(_gguf_fields(**{"gemma2.block_count": 42, "gemma2.embedding_length": 3584,
                                               "gemma2.attention.head_count": 16, "gemma2.attention.head_count_kv": 8,
                                               "gemma2.attention.key_length": 256}))
    assert smaller.gemma.query_pre_attn_scalar == 256  # head_dim
    # early conversions lack the window and the caps: llama.cpp's defaults, as its loader takes them
    early = config_from_gguf(_gguf_fields(**{"gemma2.attention.sliding_window": None,
                                             "gemma2.attn_logit_softcapping": None,
                                             "gemma2.final_logit_softcapping": None}))
    assert set(early.layer_windows) == {4096, None} and early.attn_logit_softcap == 50.0
    assert early.gemma.final_logit_softcap == 30.0


def _engine(path, **overrides) -> LLMEngine:
    settings = dict(model_path=str(path), dtype="float32", num_kv_blocks=64)
    return LLMEngine.from_config(EngineConfig(**(settings | overrides)))


def test_auto_attention_takes_a_backend_with_a_softcap_and_graphs_stay_off(family_dir):
    engine = _engine(family_dir("gemma2"))
    assert engine.runner.attention.supports_softcap and engine.runner.attention.supports_window
    assert engine.runner.attention.name in ("cpu_native", "torch")  # torch where the kernel does not build
    assert "sliding-window" in graph_support(engine.model)
    unwindowed = SimpleNamespace(deterministic=False, layers=engine.model.layers,
                                 config=dataclasses.replace(engine.model.config, layer_windows=()))
    assert "attention logit softcapping" in graph_support(unwindowed)  # named where no window refuses first


@pytest.mark.parametrize(("overrides", "named"), [
    ({"attention_backend": "cpu_fixed_order"}, "'cpu_fixed_order' has no sliding-window attention nor attention "
                                               "logit softcapping"),
    ({"deterministic": True}, "deterministic mode's attention .* logit softcapping"),
])
def test_a_backend_without_a_softcap_is_refused_by_name(family_dir, overrides, named):
    with pytest.raises(ValueError, match=named):
        _engine(family_dir("gemma2"), **overrides)


def test_float16_is_refused(family_dir):
    with pytest.raises(ModelLoadError, match="gemma2 is not served in float16"):
        _engine(family_dir("gemma2"), dtype="float16")


def _logits(model, prompt: list[int], dtype: torch.dtype) -> torch.Tensor:
    cfg, block_size, length = model.config, 16, len(prompt)
    kv = [torch.zeros(8, 2, block_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype) for _ in range(cfg.num_layers)]
    attention = TorchPagedAttention("cpu")
    attention.plan(AttentionMetadata.build([length], [length], [[0, 1, 2, 3]], block_size, "cpu"))
    return model.forward(torch.tensor(prompt), torch.arange(length), kv, attention, torch.arange(length))


@torch.inference_mode()
def test_logits_track_transformers_and_the_softcap_makes_them(family_dir):
    """A 60-token prompt (past the window of 24) in one prefill: the logits of every position against
    transformers' float32 forward of the same weights. In float32 they agree to 1e-4, and without the attention
    softcap they are far off (so the parity depends on it). In bf16 they are no further from it than
    transformers' own bf16 forward (which rounds the scores to bf16 before the cap; pdserve caps in float32)."""
    from transformers import AutoModelForCausalLM

    from services.engine.model.gemma_decoder import GemmaDecoderModel

    path = family_dir("gemma2")
    weights = load_weights(path)
    prompt = [(i * 7919) % 49000 + 17 for i in range(60)]

    def reference(dtype: torch.dtype) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        return model(input_ids=torch.tensor([prompt])).logits[0].float()

    exact = reference(torch.float32)

    def error(logits: torch.Tensor) -> float:
        return float(((logits - exact).abs().amax(-1) / exact.abs().amax(-1)).max())

    def ours(config, dtype: torch.dtype) -> torch.Tensor:
        return _logits(GemmaDecoderModel(config, dict(weights.tensors), dtype), prompt, dtype)

    assert error(ours(weights.config, torch.float32)) < 1e-4
    assert error(ours(dataclasses.replace(weights.config, attn_logit_softcap=None), torch.float32)) > 1e-2
    transformers_bf16 = error(reference(torch.bfloat16))
    assert error(ours(weights.config, torch.bfloat16)) <= 1.25 * transformers_bf16, transformers_bf16
