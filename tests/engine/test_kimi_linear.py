"""Kimi Linear and Ling 3 (Kimi Delta Attention hybrids) beyond the family test's greedy tokens: the float32 logits of
a prompt are transformers', and Kimi's attention left unrotated, Ling's bounded decay and its gate per attention head
are parts of what makes them so (the decay per key dim: the kernel test); a config numbering its layers from 1
(``linear_attn_config``) places them; the bandwidth floor counts their layers' weights; the deterministic mode is
refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe

_KIMI = dict(model_type="kimi_linear", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
             v_head_dim=24, num_experts=8, num_experts_per_token=2, moe_intermediate_size=48, num_expert_group=2,
             pad_token_id=0)


def test_its_unrotated_attention_makes_kimi_linear_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("kimi_linear"), _prompts()["long"][:80])
    assert_each_part_matters(logits, expected, {"rope": {"config": dataclasses.replace(weights.config,
                                                                                       nope_layers=())}})


def test_lings_bounded_decay_and_head_gates_make_its_logits_transformers(family_dir):
    # 40 tokens: transformers' chunked KDA in float32 strays ~1e-6 from the float64 recurrence under Ling's strong
    # decays (pdserve's kernel ~1e-7), which the layers grow past the probe's 1e-5 by 80 tokens
    weights, expected, logits = exactness_probe(family_dir("bailing_hybrid"), _prompts()["long"][:40])
    config = weights.config
    assert config.linear_attention.decay_bound == -5.0 and config.linear_attention.full_rank_gates
    full = config.kv_layers
    ungated = {name: t for name, t in weights.tensors.items()
               if not any(name == f"model.layers.{i}.self_attn.g_proj.weight" for i in full)}
    assert_each_part_matters(logits, expected, {
        "bounded decay": {"config": dataclasses.replace(config, linear_attention=dataclasses.replace(
            config.linear_attention, decay_bound=None))},
        "head gates": {"config": dataclasses.replace(config, attention_head_gate=False), "tensors": ungated}})


def test_a_config_numbering_its_layers_from_one_places_them():
    config = config_from_hf(_KIMI | {"linear_attn_config": {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3, 6],
                                                            "num_heads": 2, "head_dim": 32,
                                                            "short_conv_kernel_size": 3}})
    kda = config.linear_attention
    assert kda.layers == (0, 1, 3, 4) and kda.channel_decay and kda.ssm_shape == (2, 32, 32)
    assert kda.conv_dim == 3 * 64 and kda.conv_kernel == 3
    assert config.kv_layers == config.nope_layers == (2, 5) and config.mla.kv_lora_rank == 32
    assert config.moe.sparse_layers == (1, 2, 3, 4, 5) and config.moe.sigmoid_routing  # dense first, as its default
    assert config.moe.expert_groups == 2 and config.moe.top_k == 2
    default = config_from_hf(_KIMI)  # KimiLinearConfig's: every fourth layer attends, from the fourth
    assert default.kv_layers == (4,)


@pytest.mark.parametrize("change, named", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"layer_types": ["linear_attention"] * 5 + ["sliding_attention"]}, "layer_types must list 6"),
])
def test_what_kimi_linear_does_not_serve_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(_KIMI | change)


@pytest.mark.parametrize("name", ["kimi_linear", "bailing_hybrid"])
def test_the_weights_a_step_reads_are_its_kda_latent_attention_and_picked_experts(name, family_dir):
    """The bandwidth floor's count (``random_llama.weight_bytes``): a KDA layer's q, k, v, gate, b and o
    projections, a latent-attention layer's down and up projections, the dense MLP and, with a batch large enough
    to pick them all, every expert, the shared one and the routers."""
    from services.engine.random_llama import weight_bytes
    from services.engine.weights.model_config_reader import read_hf_config
    from tests.engine.tiny_families import load_reference

    path = family_dir(name)
    model = load_reference(path)
    cfg = config_from_hf(read_hf_config(path))
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)  # stacked, 3-D
    matrices = sum(p.numel() for name, p in model.named_parameters()
                   if p.dim() == 2 and ".experts." not in name)  # (the convolutions are 3-D, A_log 4-D)
    assert weight_bytes(cfg, 2, batch=10_000) == 2 * (matrices + experts - cfg.vocab_size * cfg.hidden_size)


def test_the_deterministic_mode_is_refused_by_name(family_dir):
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine

    with pytest.raises(ModelLoadError, match="kimi_linear is not served in the deterministic mode"):
        LLMEngine.from_config(EngineConfig(model_path=str(family_dir("kimi_linear")), dtype="float32",
                                           num_kv_blocks=16, deterministic=True))
