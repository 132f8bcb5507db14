"""Falcon-H1 beyond the family test's greedy tokens: the float32 logits of a prompt are transformers', and each of its
muP scales, the mixer's norm order and the parallel attention is what makes them so (set to 1, or flipped, each
moves them); a Falcon-H1 config keeps KV and a recurrent state on every layer; Bamba's config rotates half a head."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe

_FALCON = dict(model_type="falcon_h1", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=8,
               mamba_d_state=16, mamba_n_groups=2)


def test_every_scale_of_falcon_h1_makes_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("falcon_h1"), _prompts()["long"][:64])
    config = weights.config
    scales, multipliers = config.falcon_h1, config.multipliers

    def without(**changes) -> dict:
        return {"config": dataclasses.replace(config, falcon_h1=dataclasses.replace(scales, **changes))}

    def without_multiplier(**changes) -> dict:
        return {"config": dataclasses.replace(config, multipliers=dataclasses.replace(multipliers, **changes))}

    assert_each_part_matters(logits, expected, {
        "attention_in": without(attention_in=1.0), "attention_out": without(attention_out=1.0),
        "ssm_in": without(ssm_in=1.0), "ssm_out": without(ssm_out=1.0), "mlp_gate": without(mlp_gate=1.0),
        "mlp_down": without(mlp_down=1.0), "norm_before_gate": without(norm_before_gate=False),
        **{f"ssm[{n}]": without(ssm=tuple(1.0 if k == n else m for k, m in enumerate(scales.ssm)))
           for n in range(5)},
        "embedding": without_multiplier(embedding=1.0), "lm_head": without_multiplier(logits_scale=1.0),
        "key": without_multiplier(attention=config.head_dim ** -0.5)})


def test_falcon_h1_keeps_kv_and_a_state_on_every_layer():
    config = config_from_hf(_FALCON)
    assert config.kv_layers == (0, 1, 2) and config.recurrent.layers == (0, 1, 2)
    assert config.mamba.intermediate == 64 and config.mamba.beside_attention
    assert config.multipliers.attention == pytest.approx(16 ** -0.5)  # key_multiplier 1


@pytest.mark.parametrize("change, named", [
    ({"mamba_proj_bias": True}, "mamba_proj_bias"), ({"projectors_bias": True}, "projectors_bias"),
    ({"time_step_limit": [0.0, 10.0]}, "time_step_limit"), ({"ssm_multipliers": [1.0, 1.0]}, "ssm_multipliers"),
])
def test_what_falcon_h1_does_not_serve_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(_FALCON | change)


def test_bamba_rotates_half_of_each_head_and_needs_an_attention_layer():
    bamba = dict(model_type="bamba", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_state=16)
    config = config_from_hf(bamba | {"attn_layer_indices": [1]})
    assert config.rotary_dim == 8 and config.kv_layers == (1,) and config.mamba.layers == (0, 2)
    with pytest.raises(ModelLoadError, match="attn_layer_indices"):
        config_from_hf(bamba)


def test_the_weights_a_step_reads_are_each_layer_s_mixer_attention_and_mlp(family_dir):
    """The bandwidth floor's count (``random_llama.weight_bytes``): every layer's Mamba-2 projections beside its
    attention's, and its MLP."""
    from services.engine.random_llama import weight_bytes
    from services.engine.weights.model_config_reader import read_hf_config
    from tests.engine.tiny_families import load_reference

    path = family_dir("falcon_h1")
    model = load_reference(path)
    cfg = config_from_hf(read_hf_config(path))
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # the conv's weight is 3-D: not counted
    assert weight_bytes(cfg, 2) == 2 * (matrices - cfg.vocab_size * cfg.hidden_size)  # the table is gathered


def test_the_deterministic_mode_is_refused_by_name(family_dir):
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine

    with pytest.raises(ModelLoadError, match="falcon_h1 is not served in the deterministic mode"):
        LLMEngine.from_config(EngineConfig(model_path=str(family_dir("falcon_h1-no_norm")), dtype="float32",
                                           num_kv_blocks=16, deterministic=True))
