"""GPT-OSS beyond the family test's float32 greedy parity: OpenAI's published config read as transformers reads
it; its MXFP4 experts dequantised at load as transformers does (a tiny MXFP4 checkpoint against transformers'
own load of it); bf16 logits tracking transformers'; what is not served refused by name; the attention backend
one that has sinks, and no CUDA graphs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels.attention import AttentionMetadata, TorchPagedAttention
from services.engine.config import EngineConfig
from services.engine.decode_graphs import graph_support
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.model.gpt_oss_decoder import GptOssDecoderModel, clamped_swiglu
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights

# openai/gpt-oss-20b's config.json, as published
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}


def test_the_20b_config_reads_as_transformers_defines_it():
    cfg = config_from_hf(GPT_OSS_20B)
    assert (cfg.architecture, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers) == \
        ("gpt_oss", 2880, 64, 8, 64, 24)
    assert cfg.layer_windows == (128, None) * 12 and cfg.max_position == 131072
    scaling = cfg.rope_scaling
    assert (scaling.rope_type, scaling.factor, scaling.original_max_position, scaling.beta_fast, scaling.beta_slow,
            scaling.truncate) == ("yarn", 32.0, 4096, 32.0, 1.0, False)
    assert cfg.rope_theta == 150000 and cfg.attention_sinks and cfg.qkv_bias and cfg.o_bias
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.sparse_layers) == (32, 4, 2880, tuple(range(24)))
    assert moe.softmax_after_topk and not moe.norm_topk_prob and (moe.swiglu_limit, moe.swiglu_alpha) == (7.0, 1.702)
    assert cfg.eos_token_ids == (200002,) and not cfg.tie_word_embeddings


def test_an_absent_rope_and_layer_types_take_transformers_defaults():
    bare = {k: v for k, v in GPT_OSS_20B.items() if k not in ("rope_scaling", "layer_types", "rope_theta")}
    cfg = config_from_hf(bare)
    assert cfg.layer_windows == (128, None) * 12
    assert cfg.rope_scaling.rope_type == "yarn" and cfg.rope_scaling.factor == 32.0 and cfg.rope_theta == 150000


@pytest.mark.parametrize(("change", "named"), [
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization 'bitsandbytes'"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"layer_types": ["chunked_attention", "full_attention"] * 12}, "layer_types"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(GPT_OSS_20B | change)


def test_the_clamped_swiglu_is_gpt_oss():
    gate = torch.tensor([-10.0, -1.0, 0.0, 2.0, 9.0])
    up = torch.tensor([-9.0, -0.5, 1.0, 3.0, 8.0])
    expected = (up.clamp(-7, 7) + 1) * gate.clamp(max=7) * torch.sigmoid(1.702 * gate.clamp(max=7))
    torch.testing.assert_close(clamped_swiglu(torch.cat([gate, up]), 7.0, 1.702), expected)


def _mxfp4_checkpoint(source, target):
    """``source``'s checkpoint with its experts as OpenAI stores them: random MXFP4 codes and scales (values up
    to 6 * 2^-3) in ``*_blocks [E, out, in/32, 16]`` and ``*_scales [E, out, in/32]``."""
    target.mkdir()
    for file in source.iterdir():  # the tokenizer and generation config; the weights are rewritten below
        if file.suffix != ".safetensors" and file.name not in ("model.safetensors.index.json", "config.json"):
            shutil.copy(file, target / file.name)
    tensors = {}
    for shard in sorted(source.glob("*.safetensors")):
        tensors |= load_file(shard)
    generator = torch.Generator().manual_seed(3)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = tensors.pop(name).shape
        tensors[name + "_blocks"] = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), dtype=torch.uint8,
                                                  generator=generator)
        tensors[name + "_scales"] = torch.randint(118, 125, (experts, outputs, inputs // 32), dtype=torch.uint8,
                                                  generator=generator)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = GPT_OSS_20B["quantization_config"]
    (target / "config.json").write_text(json.dumps(config))
    return target


def _logits(model, prompt: list[int], dtype: torch.dtype) -> torch.Tensor:
    cfg, block_size = model.config, 16
    blocks = -(-len(prompt) // block_size)
    kv = [torch.zeros(blocks, 2, block_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype)
          for _ in range(cfg.num_layers)]
    attention = TorchPagedAttention("cpu")
    attention.plan(AttentionMetadata.build([len(prompt)], [len(prompt)], [list(range(blocks))], block_size, "cpu"))
    with torch.inference_mode():
        return model.forward(torch.tensor(prompt), torch.arange(len(prompt)), kv, attention,
                             torch.arange(len(prompt)))


PROMPT = [(i * 7919) % 49000 + 17 for i in range(60)]  # past the window of 24


def _reference_logits(path, dtype: torch.dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    with torch.inference_mode():
        return reference(input_ids=torch.tensor([PROMPT])).logits[0].float()


def test_mxfp4_experts_are_dequantised_as_transformers_does(family_dir, tmp_path):
    path = _mxfp4_checkpoint(family_dir("gpt_oss"), tmp_path / "mxfp4")
    weights = load_weights(path)
    model = GptOssDecoderModel(weights.config, weights.tensors, torch.float32)
    expected = _reference_logits(path, torch.float32)  # transformers dequantises on a CPU (no triton kernels)
    torch.testing.assert_close(_logits(model, PROMPT, torch.float32), expected, rtol=1e-4, atol=1e-4)


def test_mxfp4_blocks_of_the_wrong_shape_are_refused_by_name(family_dir, tmp_path):
    path = _mxfp4_checkpoint(family_dir("gpt_oss"), tmp_path / "mxfp4")
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.1.mlp.experts.down_proj_blocks"
    tensors[name] = tensors[name][:, :, :-1].contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    weights = load_weights(path)
    with pytest.raises(ModelLoadError, match=name):
        GptOssDecoderModel(weights.config, weights.tensors, torch.float32)


def test_logits_track_transformers_in_float32_and_bfloat16(family_dir):
    """Every position's logits of a 60-token prompt in one prefill against transformers' eager forward of the
    same weights in the same dtype. In float32 every position agrees; in bf16 most are within 3% of their range
    (transformers' softmax runs in bf16, pdserve's in float32), and a few differ more: a router near a tie in
    bf16 picks another expert (the random router here has many near ties)."""
    path = family_dir("gpt_oss")
    weights = load_weights(path)
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = GptOssDecoderModel(weights.config, weights.tensors, dtype)
        expected = _reference_logits(path, dtype)
        errors[dtype] = (_logits(model, PROMPT, dtype) - expected).abs().amax(-1) / expected.abs().amax(-1)
    assert errors[torch.float32].max() < 1e-4, errors[torch.float32]
    assert errors[torch.bfloat16].median() < 3e-2 and errors[torch.bfloat16].quantile(0.9) < 6e-2, \
        errors[torch.bfloat16]


def _engine(path, **overrides) -> LLMEngine:
    settings = dict(model_path=str(path), dtype="float32", num_kv_blocks=64)
    return LLMEngine.from_config(EngineConfig(**(settings | overrides)))


def test_auto_attention_takes_a_backend_with_sinks_and_graphs_stay_off(family_dir):
    engine = _engine(family_dir("gpt_oss"))
    assert engine.runner.attention.supports_sinks and engine.runner.attention.supports_window
    assert graph_support(engine.model)  # windows and sinks: the graph attention has neither


def _without_windows(family_dir, tmp_path):
    """The tiny checkpoint with no sliding windows: of what a backend may lack, only the sinks are left."""
    path = tmp_path / "no-window"
    shutil.copytree(family_dir("gpt_oss"), path)
    config = json.loads((path / "config.json").read_text())
    config["sliding_window"] = None
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_the_deterministic_mode_is_refused_naming_what_its_attention_lacks(family_dir, tmp_path):
    with pytest.raises(ValueError, match=r"deterministic mode's attention .* has no sliding-window attention nor "
                                         r"attention sinks"):
        _engine(family_dir("gpt_oss"), deterministic=True)
    with pytest.raises(ValueError, match=r"deterministic mode's attention .* has no attention sinks, which"):
        _engine(_without_windows(family_dir, tmp_path), deterministic=True)


def test_a_backend_without_sinks_is_refused_by_name(family_dir, tmp_path):
    with pytest.raises(ValueError, match="'cpu_fixed_order' has no attention sinks, which"):
        _engine(_without_windows(family_dir, tmp_path), attention_backend="cpu_fixed_order")
