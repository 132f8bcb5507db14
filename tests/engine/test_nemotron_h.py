"""Nemotron-H's config as its released files write it (``hybrid_override_pattern``: ``M`` Mamba-2, ``*``
attention, ``-`` MLP, ``E`` Nemotron 3's experts) and its tensor names (``backbone.``, one tensor per expert; the
family test serves such a file exactly); Nemotron 3 Super's latent experts, from transformers' own file, give its
logits."""

from __future__ import annotations

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.nemotron_h import nemotron_h_tensor_name
from services.engine.model.registry import config_from_hf
from services.engine.weights.model_config_reader import read_hf_config


@pytest.fixture(scope="module")
def released(family_dir):
    config = read_hf_config(family_dir("nemotron_h"))
    config.pop("layers_block_type")
    return config | {"hybrid_override_pattern": "M-*-M"}


def test_the_pattern_names_each_block(released):
    cfg = config_from_hf(released)
    assert cfg.architecture == "nemotron_h" and cfg.num_layers == 5
    assert cfg.mamba.layers == (0, 4) and cfg.mlp_blocks == (1, 3) and cfg.kv_layers == (2,)
    assert cfg.nope_layers == (2,) and cfg.mamba.dt_min == 0.0 and cfg.mamba.conv_bias  # time_step_limit's floor
    assert config_from_hf(released | {"time_step_limit": [0.01, float("inf")]}).mamba.dt_min == 0.01


def test_the_expert_blocks_are_nemotron_3_s(released):
    cfg = config_from_hf(released | {"hybrid_override_pattern": "ME*EM", "n_routed_experts": 16,
                                     "num_experts_per_tok": 4, "moe_intermediate_size": 48,
                                     "moe_shared_expert_intermediate_size": 96, "n_group": 2, "topk_group": 1,
                                     "routed_scaling_factor": 2.5, "norm_topk_prob": True})
    moe = cfg.moe
    assert cfg.block_kinds == ("mamba", "moe", "attention", "moe", "mamba") and cfg.kv_layers == (2,)
    assert cfg.mlp_blocks == (1, 3) and moe.sparse_layers == (1, 3)
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_intermediate_size) == (16, 4, 48, 96)
    assert moe.sigmoid_routing and moe.correction_bias and not moe.gated_experts and not moe.shared_expert_gated
    assert (moe.expert_groups, moe.top_groups, moe.routed_scaling, moe.norm_topk_prob) == (2, 1, 2.5, True)
    assert moe.latent_size is None
    latent = config_from_hf(released | {"hybrid_override_pattern": "ME*EM", "moe_latent_size": 32})
    assert latent.moe.latent_size == 32


@pytest.mark.parametrize(("change", "message"), [
    ({"hybrid_override_pattern": "ME*-M", "n_shared_experts": 2}, "n_shared_experts 2"),
    ({"hybrid_override_pattern": "ME*-M", "block_configs": [{"moe_intermediate_size": 48}]}, "block_configs"),
    ({"hybrid_override_pattern": "M-M-M"}, "no attention block"),
    ({"mlp_hidden_act": "silu"}, "activations"),
    ({"residual_in_fp32": True}, "residual_in_fp32"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"time_step_limit": [0.0, 10.0]}, "time_step_limit"),
])
def test_what_it_cannot_serve_is_refused_by_name(released, change, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(released | change)


def test_the_released_tensor_names():
    assert nemotron_h_tensor_name("backbone.embeddings.weight") == "model.embed_tokens.weight"
    assert nemotron_h_tensor_name("backbone.norm_f.weight") == "model.norm.weight"
    assert nemotron_h_tensor_name("backbone.layers.3.norm.weight") == "model.layers.3.input_layernorm.weight"
    assert nemotron_h_tensor_name("backbone.layers.0.mixer.norm.weight") == "model.layers.0.mixer.norm.weight"
    assert nemotron_h_tensor_name("lm_head.weight") == "lm_head.weight"
    assert nemotron_h_tensor_name("mtp.layers.0.norm.weight") is None
    assert nemotron_h_tensor_name("backbone.layers.1.mixer.experts.7.up_proj.weight") == \
        "model.layers.1.mixer.experts.7.up_proj.weight"
    assert nemotron_h_tensor_name("backbone.layers.1.mixer.shared_experts.down_proj.weight") == \
        "model.layers.1.mixer.shared_expert.down_proj.weight"
    assert nemotron_h_tensor_name("backbone.layers.1.mixer.gate.e_score_correction_bias") == \
        "model.layers.1.mixer.gate.e_score_correction_bias"


def test_latent_experts_read_their_width_and_the_projections_around_them(released):
    """The bandwidth floor's count of Super's experts: each expert's two projections in the latent width, and the
    projections down to it and back."""
    from services.engine.random_llama import weight_bytes

    base = released | {"hybrid_override_pattern": "ME*EM", "n_routed_experts": 8, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 48}
    plain, latent = config_from_hf(base), config_from_hf(base | {"moe_latent_size": 16})
    hidden = plain.hidden_size
    per_layer = 8 * 2 * 48 * (16 - hidden) + 2 * hidden * 16  # every expert picked by a large batch
    assert weight_bytes(latent, 2, batch=10_000) - weight_bytes(plain, 2, batch=10_000) == 2 * 2 * per_layer


def test_nemotron_3_super_s_latent_experts_give_transformers_logits(tmp_path):
    """Experts in a latent width (``moe_latent_size``): the tokens projected down before them, their sum back up;
    the router and the shared MLP on the hidden width. The file holds transformers 5's own layout (``model.*``,
    stacked experts, as it keeps them in memory; it saves NVIDIA's, which the family test serves)."""
    from safetensors.torch import save_file

    from services.engine.model.registry import model_class
    from services.engine.weights import load_weights
    from tests.engine.tiny_gguf import hf_logits, pdserve_logits, tiny_hf

    model = tiny_hf("nemotron_h", layers_block_type=["mamba", "moe", "attention", "moe"], head_dim=16,
                    mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4,
                    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                    moe_shared_expert_intermediate_size=64, moe_latent_size=32, n_group=2, topk_group=1,
                    routed_scaling_factor=2.5, tie_word_embeddings=False,
                    time_step_min=1e-9)  # transformers' full-sequence floor, not the releases' (see nemotron_h.py)
    model.save_pretrained(str(tmp_path))
    for file in tmp_path.glob("*.safetensors"):
        file.unlink()
    save_file({name: t.contiguous() for name, t in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    weights = load_weights(tmp_path)
    assert weights.config.moe.latent_size == 32 and weights.tensors["model.layers.1.mixer.experts.up_proj"].shape == \
        (8, 48, 32)
    ids = [(i * 37 + 5) % 96 for i in range(40)]
    ours = pdserve_logits(model_class("nemotron_h")(weights.config, weights.tensors, torch.float32), ids)
    assert torch.allclose(ours, hf_logits(model, ids), atol=1e-4, rtol=1e-4), (ours - hf_logits(model, ids)).abs().max()


def test_the_weights_a_step_reads_are_its_matrices(family_dir):
    """The bandwidth floor's count (``random_llama.weight_bytes``): a Mamba-2 block's projections, an attention
    block's, an MLP block's up and down, and no MLP beside a mixer."""
    from services.engine.random_llama import weight_bytes
    from tests.engine.tiny_families import load_reference

    path = family_dir("nemotron_h")
    model = load_reference(path)
    cfg = config_from_hf(read_hf_config(path))
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # the conv's weight is 3-D: not counted
    assert weight_bytes(cfg, 2) == 2 * (matrices - cfg.vocab_size * cfg.hidden_size)  # the table is gathered


def test_an_expert_block_s_weights_are_its_router_shared_mlp_and_picked_experts(family_dir):
    """Nemotron 3's: two projections an expert (no gate); a batch large enough picks every expert."""
    from services.engine.random_llama import weight_bytes
    from tests.engine.tiny_families import load_reference

    path = family_dir("nemotron_h-moe")
    model = load_reference(path)
    cfg = config_from_hf(read_hf_config(path))
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mixer.experts." in name)  # stacked, 3-D
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2) + experts
    assert weight_bytes(cfg, 2, batch=10_000) == 2 * (matrices - cfg.vocab_size * cfg.hidden_size)
    one_expert = 2 * cfg.hidden_size * cfg.moe.intermediate_size
    assert weight_bytes(cfg, 2, batch=1) == weight_bytes(cfg, 2, batch=10_000) - 2 * 2 * (8 - 2) * one_expert


@pytest.mark.parametrize("name", ["nemotron_h", "nemotron_h-moe", "granite_hybrid", "qwen3_5", "lfm2"])
def test_a_hybrid_config_survives_the_weights_cache_round_trip(family_dir, name):
    """The weights cache keeps a model's config as JSON (``gguf_cache_config``): tuples and the recurrent specs
    come back as they were."""
    import dataclasses
    import json

    from services.engine.weights.gguf_cache_config import config_from_dict

    cfg = config_from_hf(read_hf_config(family_dir(name)))
    assert config_from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg
