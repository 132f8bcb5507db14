"""Families one part away from a family served before (A.X-K1: DeepSeek-V3's model; MiniCPM3: latent attention with
muP's scalars; nanochat: Llama's layer with weightless norms and its rope turned the other way; Apertus 1.5: Apertus
with a pruned head; OLMo: weightless LayerNorms and clamped q/k/v; Flint: Qwen3-MoE with sinks and unrotated full
layers; Cohere's North: Cohere 2's layer with a rope per layer kind; OLMo Hybrid: Gated DeltaNet beside OLMo 3's
attention; DBRX: bias-free LayerNorms, clamped fused q/k/v, stacked experts): each part is what makes the float32 logits
of a prompt transformers' (taken away, they move), and their configs read as transformers completes them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe

PROMPT = _prompts()["long"][:64]


def test_a_x_k1s_norm_on_the_sparse_blocks_output_makes_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("axk1"), PROMPT)
    config = weights.config
    unnormed = {name: t for name, t in weights.tensors.items() if not name.endswith("post_mlp_layernorm.weight")}
    assert "model.layers.0.post_mlp_layernorm.weight" in weights.tensors  # the dense layer's, as released: not read
    assert not any(name.endswith("e_score_correction_bias") for name in weights.tensors)  # none, as released
    assert_each_part_matters(logits, expected, {"output norm": {
        "config": dataclasses.replace(config, moe=dataclasses.replace(config.moe, output_norm=False)),
        "tensors": unnormed}})


def test_minicpm3s_scalars_make_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("minicpm3"), PROMPT)
    scalars = weights.config.multipliers
    assert (scalars.embedding, scalars.head_input_divisor) == (12.0, 64 / 16)
    assert scalars.residual == pytest.approx(1.4 / 3 ** 0.5)
    assert_each_part_matters(logits, expected, {
        name: {"config": dataclasses.replace(weights.config, multipliers=dataclasses.replace(scalars, **{name: 1.0}))}
        for name in ("embedding", "residual", "head_input_divisor")})


def test_nanochats_rope_is_the_usual_one_over_swapped_halves():
    """transformers' NanoChat rotates ``(x1, x2)`` into ``(x1·cos + x2·sin, x2·cos - x1·sin)``; pdserve's rope on
    each head's halves swapped gives the same values, swapped: so q·k (and the weightless norms after rope) agree."""
    from transformers.models.nanochat.modeling_nanochat import apply_rotary_pos_emb

    from kernels.rope import RotaryEmbedding

    torch.manual_seed(0)
    x = torch.randn(5, 3, 16)
    positions = torch.tensor([0, 1, 7, 30, 100])
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 16, 2).float() / 16)
    angles = torch.cat([positions[:, None].float() * inv_freq] * 2, dim=-1)
    theirs, _ = apply_rotary_pos_emb(x, x, angles.cos(), angles.sin())  # [T, H, D]: cos unsqueezed at 1
    rope = RotaryEmbedding(16, 128, 10000.0)
    cos, sin = rope.tables(positions, torch.float32)

    def swapped(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[..., 8:], t[..., :8]], dim=-1)

    torch.testing.assert_close(swapped(rope.rotate(swapped(x), cos, sin)), theirs)
    assert not torch.allclose(rope.rotate(x, cos, sin), theirs, atol=1e-3)


def test_a_nanochat_config_reads_its_defaults_and_refuses_another_activation():
    shape = dict(model_type="nanochat", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4)
    config = config_from_hf(shape)
    assert config.final_logit_softcap == 15.0 and config.mlp_activation == "relu2" and config.qk_norm_after_rope
    assert config_from_hf(shape | {"final_logit_softcapping": None}).final_logit_softcap is None
    with pytest.raises(ModelLoadError, match="nanochat: hidden_act 'silu'"):
        config_from_hf(shape | {"hidden_act": "silu"})


def test_apertus_1p5s_checkpoint_serves_its_text_model_with_the_pruned_head():
    """The multimodal checkpoint's text model (its image and audio tokenizers not read), its head pruned to the text
    ids: those past it get no logit (the family test serves the text model's twin exactly)."""
    from services.engine.model.apertus import apertus_tensor_name

    text = dict(model_type="apertus1p5_text", vocab_size=1000, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, output_vocab_size=900)
    config = config_from_hf({"model_type": "apertus1p5", "text_config": text})
    assert (config.architecture, config.vocab_size, config.output_vocab_size) == ("apertus", 1000, 900)
    assert config_from_hf(text | {"output_vocab_size": 1000}).output_vocab_size is None  # unpruned, as transformers
    with pytest.raises(ModelLoadError, match="an LM head of 900 rows must be untied"):
        config_from_hf(text | {"tie_word_embeddings": True})
    assert apertus_tensor_name("model.language_model.layers.0.attention_layernorm.weight") == \
        "model.layers.0.input_layernorm.weight"
    assert apertus_tensor_name("model.vision_tokenizer.encoder.conv_in.weight") is None
    assert apertus_tensor_name("model.audio_tokenizer.encoder.conv.weight") is None
    assert apertus_tensor_name("lm_head.weight") == "lm_head.weight"


def test_a_pruned_heads_logits_past_it_are_minus_infinity(family_dir):
    weights, _, logits = exactness_probe(family_dir("apertus-1p5"), PROMPT[:8])
    got = logits()
    assert got.shape[-1] == weights.config.vocab_size and weights.tensors["lm_head.weight"].shape[0] == 900
    assert (got[..., 900:] == float("-inf")).all() and torch.isfinite(got[..., :900]).all()


def test_allowed_token_ids_none_of_which_a_pruned_head_scores_are_refused_by_name(family_dir):
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine
    from services.engine.errors import InvalidRequestError
    from services.engine.sampling_params import SamplingParams

    engine = LLMEngine.from_config(EngineConfig(model_path=str(family_dir("apertus-1p5")), dtype="float32",
                                                num_kv_blocks=32))
    with pytest.raises(InvalidRequestError, match=r"allowed_token_ids: none of them can be sampled.*\[0, 900\)"):
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2, allowed_token_ids=(950, 951)))
    done = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.8, allowed_token_ids=(950, 12)))
    assert done[0].token_ids == [12, 12, 12]  # the one it scores
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_olmos_clamp_makes_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("olmo"), PROMPT)
    assert weights.config.clip_qkv == 2.0 and weights.config.rms_norm_eps == 1e-5 and weights.config.layer_norm
    assert not any("norm" in name for name in weights.tensors)  # weightless, as transformers' OlmoLayerNorm
    assert_each_part_matters(logits, expected, {"clamp": {"config": dataclasses.replace(weights.config,
                                                                                        clip_qkv=None)}})


def test_flints_sinks_and_unrotated_full_layers_make_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("flint"), PROMPT)
    config = weights.config
    assert config.nope_layers == (0, 2) and config.layer_windows == (None, 24, None) and config.moe.sigmoid_routing
    sinkless = {name: t for name, t in weights.tensors.items() if not name.endswith(".sinks")}
    assert_each_part_matters(logits, expected, {
        "sinks": {"config": dataclasses.replace(config, attention_sinks=False), "tensors": sinkless},
        "rope on the full layers": {"config": dataclasses.replace(config, nope_layers=())}})


def test_norths_rope_per_layer_kind_makes_its_logits_transformers(family_dir):
    """The multimodal checkpoint's full layer has no rope (its entry null); the text model's rotates both kinds, the
    sliding layers with a base of their own."""
    weights, expected, logits = exactness_probe(family_dir("cohere_compass"), PROMPT)
    config = weights.config
    assert config.nope_layers == (1,) and config.multipliers.logits_scale == 0.25 and not config.rope_interleaved
    assert_each_part_matters(logits, expected, {"no rope": {"config": dataclasses.replace(config, nope_layers=())}})
    weights, expected, logits = exactness_probe(family_dir("cohere_compass-text"), PROMPT)
    config = weights.config
    assert (config.rope_theta, config.local_rope_theta, config.local_rope_layers) == (500000.0, 10000.0, (0, 2))
    assert config.multipliers.logits_scale == 1.0
    assert_each_part_matters(logits, expected, {"the sliding layers' base": {"config": dataclasses.replace(
        config, local_rope_layers=(), local_rope_theta=None)}})


def test_olmo_hybrids_doubled_write_strength_makes_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("olmo_hybrid"), PROMPT)
    config = weights.config
    assert config.linear_attention.negative_eigenvalues and config.nope_layers == (1,) and config.kv_layers == (1,)
    assert_each_part_matters(logits, expected, {"doubled write strength": {"config": dataclasses.replace(
        config, linear_attention=dataclasses.replace(config.linear_attention, negative_eigenvalues=False))}})
    rotated = config_from_hf({"model_type": "olmo_hybrid", "vocab_size": 1000, "hidden_size": 64,
                              "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}})
    assert rotated.nope_layers == () and rotated.rope_theta == 50000.0 and rotated.kv_layers == (3,)


def test_float32_rope_is_transformers_bit_for_bit_in_bf16():
    """OLMo's, OLMo 2's, FlexOlmo's, OLMo Hybrid's and ERNIE 4.5's transformers rotate bf16 q and k with float32 cos
    and sin, rounding once (``rope_in_float32``: :class:`~kernels.fused_ops.Float32Rope`); the model dtype's tables
    round differently."""
    from transformers.models.olmo2.modeling_olmo2 import apply_rotary_pos_emb

    from kernels.fused_ops import Float32Rope, TorchRope
    from kernels.rope import RotaryEmbedding

    torch.manual_seed(0)
    q, k = torch.randn(40, 4, 32).bfloat16(), torch.randn(40, 2, 32).bfloat16()
    positions = torch.arange(1000, 1040)
    rope = RotaryEmbedding(32, 2048, 500000.0)
    cos, sin = rope.frequency_tables()
    angles = torch.cat([cos[positions], cos[positions]], -1), torch.cat([sin[positions], sin[positions]], -1)
    theirs = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], angles[0][None], angles[1][None])
    ours = Float32Rope(rope)(q, k, Float32Rope(rope).prepare(positions))
    assert all(torch.equal(a, b[0].transpose(0, 1)) for a, b in zip(ours, theirs, strict=True))
    plain = TorchRope(rope, torch.bfloat16)
    assert not torch.equal(plain(q, k, plain.prepare(positions))[0], ours[0])
    shape = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "max_position_embeddings": 4096}
    for model_type in ("olmo", "olmo2", "flex_olmo", "ernie4_5", "olmo_hybrid"):
        extra = {"layer_types": ["linear_attention", "full_attention"]} if model_type == "olmo_hybrid" else {}
        assert config_from_hf(shape | {"model_type": model_type} | extra).rope_in_float32, model_type
    assert not config_from_hf(shape | {"model_type": "olmo3"}).rope_in_float32  # Gemma 3's rotary: model dtype


def test_dbrxs_clamp_makes_its_logits_transformers(family_dir):
    weights, expected, logits = exactness_probe(family_dir("dbrx"), PROMPT)
    config = weights.config
    assert config.clip_qkv == 2.0 and config.layer_norm and config.moe.top_k == 2 and config.moe.norm_topk_prob
    assert weights.tensors["transformer.blocks.0.ffn.experts.mlp.w2"].shape == (4 * 48, 64)  # stacked, as released
    assert_each_part_matters(logits, expected, {"clamp": {"config": dataclasses.replace(config, clip_qkv=None)}})
    with pytest.raises(ModelLoadError, match=r"moe_normalize_expert_weights 2\.0 is not supported"):
        config_from_hf({"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 1000,
                        "ffn_config": {"moe_normalize_expert_weights": 2.0}})
