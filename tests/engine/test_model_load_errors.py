"""Bad model input is refused at startup with an error naming the culprit, never a half-loaded or silently
wrong engine: a missing shard, a tensor of the wrong shape or dtype, a leftover tensor, a config missing a
field, an unknown architecture, an unsupported rope type, a tokenizer larger than the embedding."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.tokenizer import Tokenizer
from services.engine.weights import load_model_config


@pytest.fixture
def checkpoint(family_dir, tmp_path):
    return shutil.copytree(family_dir("qwen3"), tmp_path / "qwen3")


def _load(path):
    return LLMEngine.from_config(EngineConfig(model_path=str(path), dtype="float32", num_kv_blocks=16))


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def _shard_holding(path, tensor: str):
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return path / index["weight_map"][tensor]


def _rewrite_tensor(path, name: str, tensor: torch.Tensor) -> None:
    shard = _shard_holding(path, name)
    tensors = load_file(str(shard))
    tensors[name] = tensor
    save_file(tensors, str(shard), metadata={"format": "pt"})


def test_the_intact_checkpoint_loads(checkpoint):
    assert _load(checkpoint).model.config.architecture == "qwen3"


def test_a_missing_shard_is_named(checkpoint):
    shard = _shard_holding(checkpoint, "model.layers.1.self_attn.q_proj.weight")
    shard.unlink()
    with pytest.raises(ModelLoadError, match=shard.name):
        _load(checkpoint)


def test_a_tensor_of_the_wrong_shape_is_named(checkpoint):
    _rewrite_tensor(checkpoint, "model.layers.0.self_attn.k_proj.weight", torch.zeros(16, 64))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight.*shape"):
        _load(checkpoint)


def test_a_tensor_of_a_non_float_dtype_is_named(checkpoint):
    name = "model.layers.2.mlp.down_proj.weight"
    shape = load_file(str(_shard_holding(checkpoint, name)))[name].shape
    _rewrite_tensor(checkpoint, name, torch.zeros(shape, dtype=torch.int8))
    with pytest.raises(ModelLoadError, match=r"down_proj\.weight.*dtype torch\.int8"):
        _load(checkpoint)


def test_a_tensor_the_family_does_not_use_is_refused(checkpoint):
    _edit_config(checkpoint, model_type="llama", architectures=["LlamaForCausalLM"])  # Qwen3's q/k norms left over
    with pytest.raises(ModelLoadError, match="q_norm"):
        _load(checkpoint)


def test_a_config_missing_a_field_names_it(checkpoint):
    _edit_config(checkpoint, num_hidden_layers=None)
    with pytest.raises(ModelLoadError, match="num_hidden_layers"):
        load_model_config(checkpoint)


def test_an_unknown_architecture_is_refused_listing_the_supported_ones(checkpoint):
    _edit_config(checkpoint, model_type="zamba2", architectures=["Zamba2ForCausalLM"])
    supported = ("llama, smollm3, llama4_text, llama4, granite, hyperclovax, granite_swa, granitemoe_swa, "
                 "granitemoehybrid, bamba, jamba, falcon_h1, lfm2, lfm2_moe, lfm3, nemotron_h, mamba, "
                 "falcon_mamba, mamba2, granitemoe, granitemoeshared, internlm3, iquestcoder, helium, cwm, "
                 "starcoder2, phi, gpt_neox, stablelm, nemotron, jais2, arcee, apertus, apertus1p5_text, "
                 "apertus1p5, qwen2, qwen3, seed_oss, mistral, ministral, mistral3, ministral3, mixtral, phimoe, "
                 "qwen2_moe, qwen3_moe, dbrx, flint, mellum, qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, phi3, "
                 "gpt_oss, glm, nanochat, glm4, olmo, olmo2, olmo_hybrid, olmo3, flex_olmo, olmoe, "
                 "hunyuan_v1_dense, hunyuan_v1_moe, afmoe, mimo_v2_flash, dots1, hy_v3, exaone, exaone4, "
                 "exaone4_5, exaone_moe, kolibri1, cohere, cohere2, cohere_compass_text, cohere_compass, "
                 "cohere2_moe, ernie4_5, ernie4_5_moe, glm4_moe, solar_open, deepseek_v3, deepseek_v2, kimi_k2, "
                 "kimi_k25, sarvam_mla, sarvam_moe, deepseek_v32, glm_moe_dsa, glm4_moe_lite, youtu, axk1, "
                 "kimi_linear, bailing_hybrid, minicpm3, mistral4, minimax_m2, qwen3_5_text, qwen3_5, "
                 "qwen3_5_moe_text, qwen3_5_moe, qwen3_next, gemma, gemma2, vaultgemma, gemma3_text, gemma3, "
                 "gemma4_text, gemma4, gemma4_unified_text, gemma4_unified")
    with pytest.raises(ModelLoadError, match=rf"'zamba2'.*{supported}"):
        _load(checkpoint)


def test_an_unsupported_rope_type_is_refused_at_startup(checkpoint):
    _edit_config(checkpoint, rope_parameters=None, rope_theta=10000.0,  # Qwen2-VL's multimodal rope
                 rope_scaling={"rope_type": "mrope", "mrope_section": [16, 24, 24]})
    with pytest.raises(ModelLoadError, match="mrope"):
        _load(checkpoint)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path, bundled_tokenizer):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(tmp_path))
    bundled_tokenizer.hf.save_pretrained(str(tmp_path))
    assert Tokenizer.load(tmp_path).vocab_size > 1000
    with pytest.raises(ModelLoadError, match=r"49152 tokens.*1000 rows"):
        _load(tmp_path)


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_chat_template_comes_with_the_directory(checkpoint, bundled_tokenizer, where):
    from services.engine.tokenizer import ChatMessage

    if where == "tokenizer_config.json":  # older checkpoints keep it there
        template = (checkpoint / "chat_template.jinja").read_text()
        (checkpoint / "chat_template.jinja").unlink()
        config = json.loads((checkpoint / where).read_text())
        (checkpoint / where).write_text(json.dumps({**config, "chat_template": template}))
    messages = [ChatMessage("user", "Hi there")]
    loaded = Tokenizer.load(checkpoint)
    assert loaded.apply_chat_template(messages) == bundled_tokenizer.apply_chat_template(messages)
