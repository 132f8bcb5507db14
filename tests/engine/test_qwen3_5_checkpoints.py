"""Qwen3.5 as it is published: ``Qwen3_5ForConditionalGeneration`` checkpoints (``model_type`` qwen3_5, the text
model's config under ``text_config``, its tensors under ``model.language_model.``, a vision tower under
``model.visual.`` and multi-token-prediction weights under ``mtp.``). The engine serves the text model (the others
not read) with the greedy tokens transformers' multimodal class gives for a text prompt; config errors are named."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from services.engine.sampling_params import SamplingParams
from tests.engine.test_model_families import assert_matches
from tests.engine.tiny_families import greedy_full_forward

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, layer_types=["linear_attention", "full_attention", "linear_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True},
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, rms_norm_eps=1e-6, eos_token_id=2)


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory, bundled_tokenizer):
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    config = AutoConfig.for_model("qwen3_5", text_config=TEXT | {"vocab_size": len(bundled_tokenizer.hf)},
                                  vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                     out_hidden_size=64, num_position_embeddings=16),
                                  tie_word_embeddings=False)
    torch.manual_seed(7)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.3)
    path = tmp_path_factory.mktemp("qwen3_5") / "multimodal"
    model.save_pretrained(str(path))
    bundled_tokenizer.hf.save_pretrained(str(path))
    tensors = load_file(path / "model.safetensors")
    assert any(n.startswith("model.visual.") for n in tensors) and any(n.startswith("model.language_model.")
                                                                      for n in tensors)
    tensors["mtp.fc.weight"] = torch.zeros(64, 128)  # as the published files carry
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path, model


def test_the_text_model_of_a_multimodal_checkpoint_gives_transformers_tokens(multimodal):
    path, model = multimodal
    engine = LLMEngine.from_config(EngineConfig(model_path=str(path), dtype="float32", num_kv_blocks=64,
                                                max_num_batched_tokens=64))
    cfg = engine.model.config
    assert cfg.architecture == "qwen3_5" and cfg.linear_attention.layers == (0, 2) and cfg.rotary_dim == 8
    prompt = [(i * 7919) % 49000 + 17 for i in range(100)]
    expected = greedy_full_forward(model, prompt, 8)
    result = engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    assert_matches("qwen3_5/multimodal", expected, result.token_ids)


@pytest.mark.parametrize(("change", "message"), [
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention"]}, "layer_types"),
    ({"linear_num_value_heads": 3}, "value heads"),
    ({"linear_conv_kernel_dim": 1}, "conv kernel"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_a_config_it_cannot_serve_is_refused_by_name(multimodal, change, message):
    path, _ = multimodal
    config = json.loads((path / "config.json").read_text())
    config["text_config"] |= change
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(config)


def test_a_moe_config_as_transformers_defines_it_needs_no_dense_width():
    """``Qwen3_5MoeTextConfig`` has no ``intermediate_size`` (every layer's MLP is experts): its config reads."""
    from transformers import Qwen3_5MoeTextConfig

    cfg = config_from_hf(Qwen3_5MoeTextConfig().to_dict())
    assert (cfg.num_layers, cfg.moe.num_experts, cfg.moe.sparse_layers) == (40, 256, tuple(range(40)))
