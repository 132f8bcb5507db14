"""Gemma 4's configs read as transformers builds them: heads per layer in one KV slot, KV sharing as transformers'
``kv_sharing_modes``, the proportional rope's frequencies as transformers' own; the tensors not read; refusals by
name. The family test serves tiny checkpoints of both kinds exactly in process (tests/engine/test_model_families.py:
``gemma4``, ``gemma4-e``); a cluster serves the second (tests/e2e/test_model_families_cluster.py)."""

from __future__ import annotations

import pytest
import torch

from kernels.rope_frequencies import rope_frequencies
from services.engine.errors import ModelLoadError
from services.engine.model.gemma4 import gemma4_tensor_name
from services.engine.model.registry import config_from_hf, model_class

SLIDING, FULL = "sliding_attention", "full_attention"


def _text(**changes) -> dict:
    """A Gemma 4 text config of the 31B's kind (sliding heads of 256, full ones of 512 whose values are their keys)."""
    kinds = ([SLIDING] * 5 + [FULL]) * 2
    return {"model_type": "gemma4_text", "vocab_size": 1024, "hidden_size": 512, "intermediate_size": 1024,
            "num_hidden_layers": 12, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
            "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": True,
            "hidden_size_per_layer_input": 0, "layer_types": kinds, "sliding_window": 1024,
            "final_logit_softcapping": 30.0} | changes


def _e_model(**changes) -> dict:
    """A Gemma 4 wrapper of the E2B's kind: one KV head, 20 of 35 layers sharing KV, per-layer inputs."""
    text = _text(num_hidden_layers=35, num_attention_heads=8, num_key_value_heads=1, attention_k_eq_v=False,
                 num_global_key_value_heads=None, layer_types=([SLIDING] * 4 + [FULL]) * 7, num_kv_shared_layers=20,
                 hidden_size_per_layer_input=256, vocab_size_per_layer_input=1024, use_double_wide_mlp=True,
                 sliding_window=512) | changes
    return {"model_type": "gemma4", "text_config": text}


def test_full_layers_have_their_wide_heads_in_a_slot_of_the_widest_layer():
    cfg = config_from_hf(_text())
    g = cfg.gemma4
    assert cfg.architecture == "gemma4" and model_class("gemma4").__name__ == "Gemma4DecoderModel"
    assert g.layer_heads == tuple((4, 512) if i % 6 == 5 else (16, 256) for i in range(12))
    assert (cfg.num_kv_heads, cfg.head_dim) == (8, 512)  # a slot of 16 · 256 values: 8 full-width heads
    assert [g.repeats(i, cfg.kv_size) for i in (0, 5)] == [1, 2]  # a full layer's 4 heads are written twice
    assert g.value_is_key == (5, 11) and g.shared_layers == () and cfg.kv_layers == tuple(range(12))
    assert cfg.layer_windows == tuple(None if i % 6 == 5 else 1024 for i in range(12))
    assert cfg.local_rope_theta == 10000.0 and cfg.rope_theta == 1000000.0
    assert (cfg.rope_scaling.rope_type, cfg.rope_scaling.rotated_fraction, cfg.rotary_dim) == ("proportional", 0.25,
                                                                                              None)
    assert g.final_logit_softcap == 30.0 and cfg.tie_word_embeddings and cfg.moe is None


def test_kv_sharing_layers_keep_no_kv_and_read_the_layer_transformers_stores():
    from transformers import Gemma4TextConfig

    cfg = config_from_hf(_e_model())
    g = cfg.gemma4
    modes = Gemma4TextConfig.from_dict(_e_model()["text_config"]).kv_sharing_modes
    assert g.shared_layers == tuple(i for i, mode in enumerate(modes) if mode == "reuse") == tuple(range(15, 35))
    assert {g.kv_sources[i] for i in g.shared_layers} == {i for i, mode in enumerate(modes) if mode == "store"}
    assert all(g.layer_heads[g.kv_sources[i]] == g.layer_heads[i] for i in range(35))
    assert cfg.kv_layers == tuple(range(15))
    assert (cfg.num_kv_heads, cfg.head_dim) == (1, 512)  # the full layers' one head; a sliding one is written twice
    assert [g.repeats(i, cfg.kv_size) for i in (0, 4)] == [2, 1]
    assert cfg.kv_bytes_per_token(2) == 2 * 15 * 512 * 2
    assert g.double_wide_layers == g.shared_layers and g.per_layer_input_size == 256 and g.value_is_key == ()


def test_the_proportional_rope_has_transformers_frequencies():
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = _text(rope_parameters={FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                         "rope_theta": 1000000.0, "factor": 2.0},
                                  SLIDING: {"rope_type": "default", "rope_theta": 10000.0}})
    expected, _ = ROPE_INIT_FUNCTIONS["proportional"](Gemma4TextConfig.from_dict(text), "cpu", layer_type=FULL)
    cfg = config_from_hf(text)
    ours, factor = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    assert factor == 1.0 and torch.equal(ours, expected)
    assert (ours[64:] == 0).all() and (ours[:64] > 0).all()  # a quarter of the 256 angles turn


def test_the_towers_are_not_read_and_the_text_model_is():
    assert gemma4_tensor_name("model.language_model.layers.3.layer_scalar") == "model.layers.3.layer_scalar"
    assert gemma4_tensor_name("model.language_model.embed_tokens_per_layer.weight") == \
        "model.embed_tokens_per_layer.weight"
    for name in ("model.audio_tower.layers.0.self_attn.q_proj.linear.weight", "model.embed_audio.embedding.weight",
                 "model.embed_vision.embedding_projection.weight", "model.vision_tower.encoder.layers.0.mlp.weight"):
        assert gemma4_tensor_name(name) is None, name


@pytest.mark.parametrize(("config", "named"), [
    (_text(use_bidirectional_attention="all"), "use_bidirectional_attention 'all'"),
    (_text(hidden_activation="silu"), "hidden_activation 'silu' is not supported"),
    (_text(attention_bias=True), "attention_bias is not supported"),
    (_e_model(vocab_size_per_layer_input=512), "vocab_size_per_layer_input 512 is smaller than vocab_size 1024"),
    (_text(num_global_key_value_heads=3), "layer 5's 3 KV heads of 512 do not fill"),
    (_text(enable_moe_block=True, num_experts=8, moe_intermediate_size=64), "enable_moe_block needs top_k_experts"),
    (_text(rope_parameters={FULL: {"rope_type": "proportional", "rope_theta": 1e6},
                            SLIDING: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}),
     "sliding layers' rope must be plain"),
    (_text(rope_parameters={FULL: {"rope_type": "proportional", "rope_theta": 1e6}}),
     "rope_parameters has no sliding_attention entry"),
    (_text(per_layer_config={"05": {"head_dim": 512}, "11": {"head_dim": 256, "num_key_value_heads": 16}}),
     r"the full_attention layers' heads differ in width \[256, 512\]"),
])
def test_what_is_not_served_is_refused_by_name(config, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(config)


def test_the_mixture_reads_experts_beside_every_mlp():
    cfg = config_from_hf(_text(enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704))
    moe = cfg.moe
    assert cfg.gemma4.moe_beside_mlp and moe.sparse_layers == tuple(range(12))
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob) == (128, 8, 704, True)
    assert moe.float32_weights and not moe.float32_router  # the router is the decoder's own, in the model dtype
