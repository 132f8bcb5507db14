"""The ungated MLPs (``ModelConfig.mlp_activation``) beyond the family test's greedy parity: Arcee's AFM (squared
ReLU) and Apertus (xIELU with each layer's learned parameters) read from their configs; their tiny checkpoints'
logits are transformers' and each layer's xIELU parameters are what make Apertus's so; Apertus's norm names; what
is not served is refused by name."""

from __future__ import annotations

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.apertus import apertus_tensor_name
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe


def test_the_default_shapes_read_their_activations():
    afm = config_from_hf({"model_type": "arcee", "architectures": ["ArceeForCausalLM"]})
    assert (afm.architecture, afm.mlp_activation, afm.qk_norm) == ("arcee", "relu2", False)
    apertus = config_from_hf({"model_type": "apertus", "architectures": ["ApertusForCausalLM"]})
    assert (apertus.architecture, apertus.mlp_activation, apertus.qk_norm) == ("apertus", "xielu", True)


@pytest.mark.parametrize(("config", "named"), [
    ({"model_type": "arcee", "hidden_act": "silu"}, "arcee: hidden_act 'silu'"),
    ({"model_type": "arcee", "mlp_bias": True}, r"arcee: hidden_act 'relu2' \(mlp_bias True\)"),
    ({"model_type": "apertus", "hidden_act": "gelu"}, "apertus: hidden_act 'gelu'"),
])
def test_another_activation_or_mlp_biases_are_refused_by_name(config, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(config)


def test_apertus_norms_are_read_under_llama_s_names():
    assert apertus_tensor_name("model.layers.3.attention_layernorm.weight") == "model.layers.3.input_layernorm.weight"
    assert apertus_tensor_name("model.layers.3.feedforward_layernorm.weight") == \
        "model.layers.3.post_attention_layernorm.weight"
    assert apertus_tensor_name("model.layers.3.mlp.act_fn.alpha_p") == "model.layers.3.mlp.act_fn.alpha_p"


def test_the_logits_are_transformers_and_apertus_s_xielu_parameters_make_them_so(family_dir):
    weights, expected, logits = exactness_probe(family_dir("arcee"), _prompts()["long"][:48])
    assert_each_part_matters(logits, expected, {})
    weights, expected, logits = exactness_probe(family_dir("apertus"), _prompts()["long"][:48])
    tensors = weights.tensors
    assert_each_part_matters(logits, expected, {
        "each layer's alpha_p": dict(tensors={**tensors, **{n: t + 1.0 for n, t in tensors.items()
                                                            if n.endswith("act_fn.alpha_p")}}),
        "each layer's alpha_n": dict(tensors={**tensors, **{n: t + 1.0 for n, t in tensors.items()
                                                            if n.endswith("act_fn.alpha_n")}}),
    })


def test_the_bandwidth_floor_counts_an_ungated_mlp_s_two_projections(family_dir):
    from services.engine.random_llama import weight_bytes
    from services.engine.weights import load_weights
    from tests.engine.tiny_families import load_reference

    for name in ("arcee", "apertus"):
        path = family_dir(name)
        config = load_weights(path).config
        matrices = sum(p.numel() for p in load_reference(path).parameters() if p.dim() == 2)
        # the untied head is read, the embedding table gathered (not counted)
        assert weight_bytes(config, 2) == 2 * (matrices - config.vocab_size * config.hidden_size), name


def test_an_unknown_activation_or_one_a_family_s_own_mlp_cannot_run_is_refused_by_name(family_dir):
    import dataclasses

    from services.engine.model.gemma_decoder import GemmaDecoderModel
    from services.engine.weights import load_weights

    afm = config_from_hf({"model_type": "arcee"})
    with pytest.raises(ModelLoadError, match="mlp_activation 'silu' is not one of swiglu, relu2, xielu, gelu_tanh, "
                                             "gelu"):
        dataclasses.replace(afm, mlp_activation="silu")
    gemma = load_weights(family_dir("gemma2"))
    with pytest.raises(ModelLoadError, match="gemma2: its decoder's layers are its own; mlp_activation 'relu2'"):
        GemmaDecoderModel(dataclasses.replace(gemma.config, mlp_activation="relu2"), dict(gemma.tensors),
                          torch.float32)
