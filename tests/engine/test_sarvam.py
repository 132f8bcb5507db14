"""Sarvam's two families beyond the family test's parity: Sarvam-105B's released config (the legacy ``head_dim`` and
``deepseek_yarn`` rope) reads as the DeepSeek-V3 config it is, and Sarvam-30B's tiny twin holds the released
Bailing-MoE names (so the family test's parity covers their reading, the fused q/k/v among them)."""

from __future__ import annotations

from safetensors import safe_open

from services.engine.model.registry import config_from_hf

_SARVAM_105B = dict(model_type="sarvam_mla", vocab_size=1000, hidden_size=256, intermediate_size=512,
                    num_hidden_layers=4, num_attention_heads=4, kv_lora_rank=64, qk_rope_head_dim=32,
                    qk_nope_head_dim=64, v_head_dim=64, moe_intermediate_size=64, n_routed_experts=8,
                    num_experts_per_tok=2, max_position_embeddings=131072, rope_theta=10000.0)
_YARN = dict(factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
             mscale_all_dim=1.0)


def test_sarvam_105b_legacy_config_reads_as_its_deepseek_v3_form():
    legacy = config_from_hf(_SARVAM_105B | {"head_dim": 32, "q_head_dim": 96,
                                            "rope_scaling": {"type": "deepseek_yarn", **_YARN}})
    current = config_from_hf(_SARVAM_105B | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0,
                                                                 **_YARN}})
    assert legacy == current
    assert legacy.architecture == "deepseek" and legacy.mla.q_lora_rank is None
    assert legacy.rope_scaling.rope_type == "yarn" and legacy.rope_scaling.factor == 32.0
    # SarvamMLAConfig's routing: one group, one dense layer first
    assert legacy.moe.sparse_layers == (1, 2, 3) and legacy.moe.expert_groups == 1 and legacy.moe.sigmoid_routing


def test_sarvam_30b_twin_is_written_under_bailing_names(family_dir):
    names = set()
    for shard in family_dir("sarvam_moe").glob("*.safetensors"):
        with safe_open(shard, "pt") as handle:
            names |= set(handle.keys())
    assert {"model.word_embeddings.weight", "model.layers.1.attention.query_key_value.weight",
            "model.layers.1.attention.query_key_value.bias", "model.layers.1.attention.dense.weight",
            "model.layers.1.attention.query_layernorm.weight", "model.layers.1.mlp.gate.expert_bias"} <= names
    assert not any(".q_proj." in name or "embed_tokens" in name for name in names)
