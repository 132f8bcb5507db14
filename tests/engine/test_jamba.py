"""Jamba beyond the family test's greedy tokens: the float32 logits of a prompt are transformers', and its Mamba
layers' inner norms (on the step-size rows, B and C) and its unrotated attention are what make them so; a Jamba
config places its attention, Mamba and expert layers by their periods and offsets, and what it does not serve is
refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe

_JAMBA = dict(model_type="jamba", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)


def test_the_inner_norms_and_the_unrotated_attention_make_jamba_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("jamba"), _prompts()["long"][:64])
    config = weights.config
    unnormed = {name: t for name, t in weights.tensors.items()
                if not name.endswith(("dt_layernorm.weight", "b_layernorm.weight", "c_layernorm.weight"))}
    assert_each_part_matters(logits, expected, {
        "inner norms": {"config": dataclasses.replace(
            config, mamba1=dataclasses.replace(config.mamba1, inner_norms=False)), "tensors": unnormed},
        "no rope": {"config": dataclasses.replace(config, nope_layers=())}})


def test_a_jamba_config_places_its_layers_by_period_and_offset():
    config = config_from_hf(_JAMBA)  # JambaConfig's defaults: attention every 8th from 4, experts every 2nd from 1
    assert config.kv_layers == (4,) and config.nope_layers == (4,)
    assert config.mamba1.layers == (0, 1, 2, 3, 5, 6, 7) and config.mamba1.dt_rank == 4  # ceil(64 / 16)
    assert config.mamba1.inner == 128 and config.mamba1.ssm_shape == (128, 16) and config.mamba1.inner_norms
    assert config.moe.sparse_layers == (1, 3, 5, 7) and not config.moe.norm_topk_prob
    dense = config_from_hf(_JAMBA | {"num_experts": 1})
    assert dense.moe is None


@pytest.mark.parametrize("change, named", [
    ({"mamba_proj_bias": True}, "mamba_proj_bias"),
    ({"attn_layer_period": 9, "attn_layer_offset": 8}, "no attention layer"),
])
def test_what_jamba_does_not_serve_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(_JAMBA | change)


def test_the_weights_a_step_reads_are_its_mamba_attention_and_picked_experts(family_dir):
    """The bandwidth floor's count (``random_llama.weight_bytes``): a Mamba layer's in, x, dt and out projections,
    the attention's, the dense MLPs and, with a batch large enough to pick them all, every expert and router."""
    from services.engine.random_llama import weight_bytes
    from services.engine.weights.model_config_reader import read_hf_config
    from tests.engine.tiny_families import load_reference

    path = family_dir("jamba")
    model = load_reference(path)
    cfg = config_from_hf(read_hf_config(path))
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)  # stacked, 3-D
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and not name.endswith("A_log"))
    assert weight_bytes(cfg, 2, batch=10_000) == 2 * (matrices + experts - cfg.vocab_size * cfg.hidden_size)


def test_the_deterministic_mode_is_refused_by_name(family_dir):
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine

    with pytest.raises(ModelLoadError, match="jamba is not served in the deterministic mode"):
        LLMEngine.from_config(EngineConfig(model_path=str(family_dir("jamba")), dtype="float32", num_kv_blocks=16,
                                           deterministic=True))
