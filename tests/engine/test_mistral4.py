"""Mistral Small 4's config as released (``mistral3`` around a ``mistral4`` text model, FP8 per tensor; the text model
is transformers' ``Mistral4Config`` defaults, which are that checkpoint's), and a ``mistral4`` text model on its own,
read as transformers builds them; its router against transformers' own; refusals by name. The family test serves
the tiny checkpoint exactly in process (tests/engine/test_model_families.py); its layer's two parts are served by
clusters in DeepSeek-V3's and Ministral 3's (tests/e2e/test_model_families_cluster.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.config import MoEConfig
from services.engine.model.moe import route
from services.engine.model.registry import config_from_hf, model_class
from tests.engine.router_reference import assert_routes_as, router_weights
from tests.engine.test_mistral3 import PIXTRAL


def _small_4_text() -> dict:
    from transformers import Mistral4Config

    return Mistral4Config().to_dict()


def _small_4() -> dict:
    return {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "image_token_index": 10,
            "multimodal_projector_bias": False, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
            "text_config": _small_4_text(), "vision_config": PIXTRAL | {"image_size": 1540},
            "quantization_config": {"activation_scheme": "static", "dequantize": False, "quant_method": "fp8",
                                    "weight_block_size": None, "modules_to_not_convert": ["lm_head"]}}


def test_mistral_small_4_reads_latent_attention_grouped_softmax_experts_and_the_temperature():
    cfg = config_from_hf(_small_4())
    assert cfg.architecture == "mistral4" and model_class(cfg.architecture).__name__ == "LatentAttentionDecoderModel"
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (36, 4096, 32, 1)
    mla = cfg.mla
    assert (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim, mla.q_lora_rank) == (
        256, 64, 64, 128, 1024)
    assert (cfg.head_dim, cfg.rotary_dim, cfg.rope_interleaved) == (320, 64, True)  # one cached row: rope + latent
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_intermediate_size) == (
        128, 4, 2048, 2048)
    assert moe.grouped_softmax and not moe.sigmoid_routing and not moe.correction_bias and moe.float32_router
    assert (moe.expert_groups, moe.top_groups, moe.routed_scaling, moe.norm_topk_prob) == (1, 1, 1.0, True)
    assert moe.sparse_layers == tuple(range(36))  # first_k_dense_replace 0
    scaling = cfg.rope_scaling
    assert (scaling.rope_type, scaling.factor, scaling.original_max_position) == ("yarn", 128.0, 8192)
    assert (cfg.query_temperature_beta, cfg.query_temperature_period) == (0.1, 8192)
    # transformers' yarn_apply_mscale: mscale_all_dim 1 squares 0.1 · ln(128) + 1 into the scores' scale
    assert cfg.multipliers.attention == pytest.approx(128**-0.5 * (0.1 * math.log(128.0) + 1.0) ** 2)
    # Mistral3Config's default ties; the release stores a head of its own, which the loader keeps untied
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == (2,)


def test_the_text_model_on_its_own_reads_as_the_wrappers():
    alone, wrapped = config_from_hf(_small_4_text()), config_from_hf(_small_4())
    assert not alone.tie_word_embeddings  # Mistral4Config's default
    assert dataclasses.replace(alone, tie_word_embeddings=True) == wrapped


@pytest.mark.parametrize(("groups", "top_groups"), [(1, 1), (4, 2), (4, 1)])
def test_the_router_picks_transformers_experts_and_weights(groups, top_groups):
    from transformers import Mistral4Config
    from transformers.models.mistral4.modeling_mistral4 import Mistral4TopkRouter

    hf = Mistral4TopkRouter(Mistral4Config(hidden_size=32, n_routed_experts=16, num_experts_per_tok=3, n_group=groups,
                                           topk_group=top_groups, routed_scaling_factor=2.5, norm_topk_prob=True))
    config = MoEConfig(num_experts=16, top_k=3, intermediate_size=8, norm_topk_prob=True, sparse_layers=(0,),
                       grouped_softmax=True, expert_groups=groups, top_groups=top_groups, routed_scaling=2.5)
    x = assert_routes_as(hf, config, seed=7)
    if top_groups < groups:  # the group limit changes some choice (else this test could not tell it apart)
        limited = route(x, router_weights(hf), config)[1]
        free = route(x, router_weights(hf), dataclasses.replace(config, expert_groups=1, top_groups=1))[1]
        assert not torch.equal(free.sort(dim=-1).values, limited.sort(dim=-1).values)


def _with_rope(text: dict, **changes) -> dict:
    return text | {"rope_parameters": text["rope_parameters"] | changes}


@pytest.mark.parametrize(("change", "named"), [
    (lambda t: _with_rope(t, partial_rotary_factor=0.25), "partial_rotary_factor 0.25 does not give qk_rope_head_dim"),
    (lambda t: {**t, "rope_parameters": {k: v for k, v in t["rope_parameters"].items()
                                         if k != "llama_4_scaling_beta"}}, "mistral4: .*no llama_4_scaling_beta"),
    (lambda t: t | {"attention_bias": True}, "attention_bias is not supported"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(_small_4() | {"text_config": change(_small_4_text())})
