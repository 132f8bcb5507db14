"""GLM-4.5 (and Solar Open) beyond the family tests' float32 parity (tests/engine/test_model_families.py): the
published configs read into half-rotated heads (Solar Open's whole), sigmoid routing and shared experts; each part
of the routing (the correction bias, the groups, the scaling) is what makes the logits transformers'; the router
runs in float32 in a bf16 model; the multi-token-prediction layer a checkpoint carries is not read; the shared
experts' names map."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from kernels.linear import prepare_linear
from services.engine.errors import ModelLoadError
from services.engine.model.config import MoEConfig
from services.engine.model.decoder import DecoderModel
from services.engine.model.glm4_moe import glm4_moe_tensor_name
from services.engine.model.moe import MoEWeights, moe_forward, route
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# the shape of zai-org/GLM-4.5-Air's config.json
GLM_45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "pad_token_id": 151329,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 10944,
    "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": True,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
    "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_hidden_layers": 46,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_qk_norm": False, "vocab_size": 151552,
}
# GLM-4.5 (355B-A32B) differs in these
GLM_45 = GLM_45_AIR | {"hidden_size": 5120, "intermediate_size": 12288, "num_hidden_layers": 92,
                       "n_routed_experts": 160, "first_k_dense_replace": 3, "routed_scaling_factor": 2.5,
                       "use_qk_norm": True}


def test_the_published_shapes_read_half_rotated_heads_and_sigmoid_routed_experts():
    air = config_from_hf(GLM_45_AIR)
    assert (air.architecture, air.num_layers, air.num_heads, air.num_kv_heads, air.head_dim, air.rotary_dim) == \
        ("glm4_moe", 46, 96, 8, 128, 64)
    assert air.qkv_bias and not air.o_bias and not air.qk_norm and air.rms_norm_eps == 1e-5
    moe = air.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.sparse_layers) == (128, 8, 1408, tuple(range(1, 46)))
    assert moe.sigmoid_routing and moe.norm_topk_prob and moe.routed_scaling == 1.0
    assert (moe.shared_expert_intermediate_size, moe.shared_expert_gated) == (1408, False)
    big = config_from_hf(GLM_45)
    assert big.qk_norm and big.moe.routed_scaling == 2.5 and big.moe.sparse_layers[0] == 3
    assert big.moe.num_experts == 160
    # Glm4MoeConfig's default when the key is absent: half of each head rotates
    absent = config_from_hf({k: v for k, v in GLM_45_AIR.items() if k != "partial_rotary_factor"})
    assert absent.rotary_dim == 64
    # Solar Open 100B (SolarOpenConfig's defaults): Llama's attention, the whole head rotated, experts on every layer;
    # the GLM keys it has no field for are ignored, as transformers ignores them
    solar = config_from_hf({"model_type": "solar_open", "first_k_dense_replace": 3, "use_qk_norm": True})
    assert (solar.architecture, solar.rotary_dim, solar.qk_norm, solar.qkv_bias) == ("glm4_moe", None, False, False)
    assert (solar.moe.num_experts, solar.moe.intermediate_size, solar.moe.shared_expert_intermediate_size) == \
        (128, 1280, 1280)
    assert solar.moe.sparse_layers == tuple(range(48)) and solar.rope_theta == 1e6 and solar.head_dim == 128
    with pytest.raises(ModelLoadError, match="partial_rotary_factor is not supported for solar_open"):
        config_from_hf({"model_type": "solar_open", "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                                       "partial_rotary_factor": 0.5}})


@pytest.mark.parametrize(("change", "field"), [
    ({"n_group": 3}, "n_group 3 must divide"),
    ({"topk_group": 2}, "topk_group 2 must be in"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
])
def test_a_config_whose_routing_cannot_hold_names_the_field(change, field):
    with pytest.raises(ModelLoadError, match=field):
        config_from_hf(GLM_45_AIR | change)


@pytest.mark.parametrize(("checkpoint", "decoder"), [
    ("model.layers.3.mlp.shared_experts.gate_proj.weight", "model.layers.3.mlp.shared_expert.gate_proj.weight"),
    ("model.layers.3.mlp.shared_experts.down_proj.weight", "model.layers.3.mlp.shared_expert.down_proj.weight"),
    ("model.layers.3.mlp.gate.e_score_correction_bias", "model.layers.3.mlp.gate.e_score_correction_bias"),
    ("model.layers.3.mlp.experts.7.up_proj.weight", "model.layers.3.mlp.experts.7.up_proj.weight"),
])
def test_checkpoint_names_map_onto_the_shared_decoder(checkpoint, decoder):
    assert glm4_moe_tensor_name(checkpoint) == decoder


@pytest.fixture(scope="module")
def glm(family_dir):
    path = family_dir("glm4_moe")
    return path, load_weights(path), load_reference(path)


def test_each_part_of_the_routing_is_what_makes_it_exact(glm):
    """A prompt's logits equal transformers'; the same weights without the correction bias, without the groups
    (every expert eligible), or without the routed scaling are far from them."""
    _, weights, reference = glm
    prompt = _prompts()["short"]
    expected = hf_logits(reference, prompt)

    def logits(config, tensors=weights.tensors) -> torch.Tensor:
        return pdserve_logits(DecoderModel(config, tensors, torch.float32), prompt)

    assert torch.allclose(logits(weights.config), expected, atol=1e-4, rtol=1e-4)
    moe = weights.config.moe
    for wrong in (dataclasses.replace(moe, top_groups=moe.expert_groups), dataclasses.replace(moe, routed_scaling=1.0)):
        assert (logits(dataclasses.replace(weights.config, moe=wrong)) - expected).abs().max() > 1e-2, wrong
    unbiased = {n: torch.zeros_like(t) if n.endswith("e_score_correction_bias") else t
                for n, t in weights.tensors.items()}
    assert (logits(weights.config, unbiased) - expected).abs().max() > 1e-2


def test_the_grouped_experts_path_gives_the_loop_s_logits(glm):
    """GPUs run a sparse layer's experts as grouped GEMMs: with sigmoid routing they give the loop's logits."""
    _, weights, _ = glm
    prompt = _prompts()["short"]
    looped, grouped = (pdserve_logits(DecoderModel(weights.config, weights.tensors, torch.float32,
                                                   grouped_experts=flag), prompt) for flag in (False, True))
    assert torch.allclose(grouped, looped, atol=1e-5, rtol=1e-5)


def test_a_bf16_model_routes_in_float32(glm):
    """The router's weights and correction bias stay float32 in a bf16 model, as GLM's run: a bias step below
    bf16's resolution at 1.0 (which the sum sigmoid + bias would lose) still picks the expert."""
    _, weights, _ = glm
    model = DecoderModel(weights.config, weights.tensors, torch.bfloat16)
    sparse = model.layers[weights.config.moe.sparse_layers[0]].moe
    assert sparse.router.weight.dtype == torch.float32 and sparse.choice_bias.dtype == torch.float32
    config = MoEConfig(num_experts=4, top_k=1, intermediate_size=8, norm_topk_prob=False, sparse_layers=(0,),
                       sigmoid_routing=True)
    router = prepare_linear(torch.zeros(4, 8), pack=False)  # every score sigmoid(0) = 0.5
    bias = torch.tensor([0.5, 0.5 + 2**-10, 0.5, 0.5])  # 1.0 vs 1.0 + 2^-10: equal in bf16
    _, experts = route(torch.ones(3, 8, dtype=torch.bfloat16), MoEWeights(router, [], [], choice_bias=bias), config)
    assert experts.flatten().tolist() == [1, 1, 1]


def test_the_multi_token_prediction_layer_is_not_read(glm, tmp_path):
    """A checkpoint with its MTP layer (``model.layers.{num_layers}.*``, as GLM-4.5's) loads the same model; a
    tensor of another kind left over is still refused by name."""
    path, weights, _ = glm
    copy = tmp_path / "glm"
    shutil.copytree(path, copy)
    layers = weights.config.num_layers
    mtp = {f"model.layers.{layers}.eh_proj.weight": torch.randn(64, 128),
           f"model.layers.{layers}.self_attn.q_proj.weight": torch.randn(128, 64)}
    save_file(mtp, str(copy / "mtp.safetensors"))
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    index["weight_map"].update({name: "mtp.safetensors" for name in mtp})
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_weights(copy)
    assert not any(name.startswith(f"model.layers.{layers}.") for name in loaded.tensors)
    DecoderModel(loaded.config, loaded.tensors, torch.float32)
    save_file({"model.extra_norm.weight": torch.ones(64)}, str(copy / "extra.safetensors"))
    index["weight_map"]["model.extra_norm.weight"] = "extra.safetensors"
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"model\.extra_norm\.weight"):
        extra = load_weights(copy)
        DecoderModel(extra.config, extra.tensors, torch.float32)


def test_a_bf16_expert_output_takes_its_float32_weight_rounding_once():
    """transformers' GLM-4.5 multiplies a bf16 expert output by its float32 weight (times the routed scaling) and
    rounds once; rounding the weight to bf16 first, as the softmax families' weights are, gives other bits."""
    gen = torch.Generator().manual_seed(3)
    config = MoEConfig(num_experts=2, top_k=1, intermediate_size=8, norm_topk_prob=False, sparse_layers=(0,),
                       sigmoid_routing=True, routed_scaling=2.5)
    router = prepare_linear(torch.randn(2, 16, generator=gen), pack=False)
    experts = [prepare_linear(torch.randn(16, 16, generator=gen).bfloat16(), pack=False) for _ in range(2)]
    downs = [prepare_linear(torch.randn(16, 8, generator=gen).bfloat16(), pack=False) for _ in range(2)]
    weights = MoEWeights(router, experts, downs, choice_bias=torch.zeros(2))
    x = torch.randn(64, 16, generator=gen).bfloat16()
    probs, chosen = route(x, weights, config)
    got = moe_forward(x, weights, config)
    for t in range(64):
        e = int(chosen[t, 0])
        gate, up = F.linear(x[t:t + 1], experts[e].weight).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, downs[e].weight)
        once = (y.float() * probs[t, 0]).bfloat16()
        assert torch.equal(got[t:t + 1], once), t
    twice = [(F.linear(F.silu(g) * u, downs[int(chosen[t, 0])].weight) * probs[t, 0].bfloat16())
             for t in range(64) for g, u in [F.linear(x[t:t + 1], experts[int(chosen[t, 0])].weight).chunk(2, -1)]]
    assert not torch.equal(torch.cat(twice), got)
