"""Mistral 4 GGUF files (llama.cpp's ``mistral4``: Mistral Small 4), written from tiny transformers ``mistral4`` models
the way its converter writes them (its DeepSeek converter's subclass: ``kv_b_proj`` split per head into ``attn_k_b``
and ``attn_v_b``, yarn's ``mscale_all_dim`` as a tenth of ``yarn_log_multiplier``, the experts' fused gate/up kept as
``ffn_gate_up_exps``, the softmax routing among groups), load into the latent-attention decoder whose float32 logits
equal the HF twin's; the config equals the one read from the model's ``config.json``, torch-free alike; a file without
the temperature is served as llama.cpp serves it."""

from __future__ import annotations

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.test_gguf_deepseek2 import IDS, _quantised, write_deepseek2_gguf
from tests.engine.tiny_gguf import SHAPE, all_f32, randomise_norms_and_biases, read_as_the_twin


def _kind(original: int) -> dict:
    """Mistral Small 4's kind: a q LoRA, the softmax's top-2 among the best of two groups (each scored by its best
    two), renormalised and times 2, a shared expert, the first layer dense; yarn whose original context is
    ``original`` (the temperature's period)."""
    return dict(q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24,
                num_key_value_heads=4, tie_word_embeddings=False, n_routed_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                routed_scaling_factor=2.0, norm_topk_prob=True,
                rope_parameters={"rope_type": "yarn", "type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                 "original_max_position_embeddings": original, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1})


def _tiny(original: int):
    """A float32 ``Mistral4ForCausalLM`` (transformers maps no auto class to it: the released checkpoint is
    Mistral 3's wrapper) as ``tiny_hf`` builds one."""
    from transformers.models.mistral4.modeling_mistral4 import Mistral4Config, Mistral4ForCausalLM

    config = Mistral4Config(**{**SHAPE, "bos_token_id": 1, "eos_token_id": 2, **_kind(original)})
    torch.manual_seed(0)
    model = Mistral4ForCausalLM._from_config(config, dtype=torch.float32).eval()
    randomise_norms_and_biases(model)
    return model


def _keys(cfg, temperature: bool) -> dict:
    """The converter's keys beyond DeepSeek's writer's: the softmax and its groups (from n_group and topk_group, its
    generic writer's); the temperature where the file is of Mistral's own format."""
    keys = {"expert_gating_func": 1, "expert_group_count": cfg.n_group, "expert_group_used_count": cfg.topk_group}
    if temperature:
        rope = cfg.rope_parameters
        keys.update({"attention.temperature_scale": float(rope["llama_4_scaling_beta"]),
                     "attention.temperature_length": rope["original_max_position_embeddings"]})
    return keys


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
def test_a_mistral4_file_gives_transformers_logits(tmp_path, quant):
    """The temperature's period 16 within the 45-token prompt, so a misread temperature shows."""
    model = _tiny(16)
    path = write_deepseek2_gguf(model, tmp_path / "tiny-mistral4.gguf", quant, arch="mistral4",
                                keys=_keys(model.config, temperature=True))
    cfg = read_as_the_twin(path, model, IDS)
    assert cfg.architecture == "mistral4" and cfg.moe.grouped_softmax and cfg.moe.expert_groups == 2
    assert (cfg.query_temperature_beta, cfg.query_temperature_period) == (0.1, 16)


def test_a_file_without_the_temperature_is_served_without_it(tmp_path):
    """llama.cpp's converter writes no temperature from a Hugging Face checkpoint: served as llama.cpp serves it (the
    logits the checkpoint's within its original context, 64 here)."""
    model = _tiny(64)
    path = write_deepseek2_gguf(model, tmp_path / "tiny-mistral4.gguf", arch="mistral4",
                                keys=_keys(model.config, temperature=False))
    cfg = read_as_the_twin(path, model, IDS, file_own=("query_temperature_beta", "query_temperature_period"))
    assert (cfg.query_temperature_beta, cfg.query_temperature_period) == (0.0, 0)


def test_a_mistral4_file_with_sigmoid_routing_is_refused(tmp_path):
    model = _tiny(16)
    path = write_deepseek2_gguf(model, tmp_path / "tiny-mistral4.gguf", arch="mistral4",
                                keys={**_keys(model.config, temperature=True), "expert_gating_func": 2})
    with pytest.raises(ModelLoadError, match="mistral4: expert_gating_func 2"):
        read_gguf_config(path)


def test_the_temperature_s_period_is_the_file_s_temperature_length(tmp_path):
    """llama.cpp's period is ``attention.temperature_length`` where the file has it (Mistral's own format writes the
    original context there), before the yarn's original context."""
    model = _tiny(16)
    path = write_deepseek2_gguf(model, tmp_path / "tiny-mistral4.gguf", arch="mistral4",
                                keys={**_keys(model.config, temperature=True), "attention.temperature_length": 8})
    assert read_gguf_config(path).query_temperature_period == 8


def test_a_deepseek2_file_of_mistral_s_own_format_keeps_its_temperature(tmp_path):
    """llama.cpp converts Mistral's own checkpoints (Mistral Large 3, Small 4 in Mistral's format) as ``deepseek2``
    with the temperature's keys: read there too."""
    from tests.engine.test_gguf_deepseek2 import V3
    from tests.engine.test_gguf_deepseek2 import _tiny as tiny_deepseek

    keys = {"attention.temperature_scale": 0.1, "attention.temperature_length": 16}
    path = write_deepseek2_gguf(tiny_deepseek("deepseek_v3", V3), tmp_path / "tiny-large3.gguf", keys=keys)
    cfg = read_gguf_config(path)
    assert (cfg.architecture, cfg.query_temperature_beta, cfg.query_temperature_period) == ("deepseek", 0.1, 16)
