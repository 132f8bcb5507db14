"""MiMo-V2-Flash beyond the family test's greedy parity (tests/engine/test_model_families.py): ``MiMoV2FlashConfig``'s
shape reads into KV heads per layer in one slot, narrower values, sinks on the sliding layers and a rope per kind of
layer; the tiny checkpoint's logits are transformers' and each part of its attention is what makes them so; the
released names; refusals by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.mimo_v2_flash import mimo_tensor_name
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe

MIMO = {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash"}  # MiMoV2FlashConfig's defaults


def test_the_default_shape_reads_kv_heads_per_layer_narrow_values_and_sinks():
    cfg = config_from_hf(MIMO)
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("mimo_v2_flash", 48, 64, 8, 192)
    full = (0, 5, 11, 17, 23, 29, 35, 41, 47)
    assert tuple(i for i in range(48) if cfg.layer_windows[i] is None) == full
    assert {cfg.layer_windows[i] for i in range(48) if i not in full} == {129}
    mimo = cfg.mimo
    assert all(mimo.kv_heads[i] == (4 if i in full else 8) for i in range(48))
    assert (mimo.v_head_dim, mimo.value_scale) == (128, 0.707) and mimo.sink_layers == cfg.local_rope_layers
    assert cfg.rotary_dim == 64 and (cfg.rope_theta, cfg.local_rope_theta) == (5e6, 1e4)
    assert cfg.moe.sparse_layers == tuple(range(1, 48)) and cfg.moe.shared_expert_intermediate_size is None
    assert cfg.moe.sigmoid_routing and cfg.moe.num_experts == 256 and cfg.attention_sinks


@pytest.fixture(scope="module")
def mimo(family_dir):
    return exactness_probe(family_dir("mimo_v2_flash"), _prompts()["long"][:64])  # past the window of 24


def test_each_part_of_the_attention_is_what_makes_the_logits_transformers(mimo):
    weights, expected, logits = mimo
    cfg, tensors = weights.config, weights.tensors
    assert_each_part_matters(logits, expected, {
        "the value scale": dict(config=dataclasses.replace(cfg, mimo=dataclasses.replace(cfg.mimo, value_scale=1.0))),
        "the sliding layers' own rope": dict(config=dataclasses.replace(cfg, local_rope_theta=cfg.rope_theta)),
        "the window": dict(config=dataclasses.replace(cfg, layer_windows=())),
        "the sinks": dict(tensors={**tensors, **{n: torch.full_like(t, -1e4) for n, t in tensors.items()
                                                 if n.endswith("self_attn.sinks")}}),
    })


def test_the_released_names():
    assert mimo_tensor_name("model.layers.3.self_attn.attention_sink_bias") == "model.layers.3.self_attn.sinks"
    assert mimo_tensor_name("model.layers.3.mlp.gate.e_score_correction_bias") == \
        "model.layers.3.mlp.gate.e_score_correction_bias"
    assert mimo_tensor_name("model.mtp.0.self_attn.q_proj.weight") is None  # multi-token prediction: not read


def test_what_is_not_served_is_refused_by_name():
    # a kind without a partial_rotary_factor rotates a third of each head (MiMo's default), as the other does
    unsaid = {"full_attention": {"rope_type": "default", "rope_theta": 5e6},
              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert config_from_hf(MIMO | {"rope_parameters": unsaid}).rotary_dim == 64
    halves = {**unsaid, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}
    with pytest.raises(ModelLoadError, match="the sliding layers' rope must be plain over the full layers' rotary"):
        config_from_hf(MIMO | {"rope_parameters": halves})
    with pytest.raises(ModelLoadError, match="do not split over 8 KV heads"):
        config_from_hf(MIMO | {"num_attention_heads": 60})
