"""IBM Granite 4.0 hybrid (llama.cpp's ``granitehybrid``), Nemotron-H (``nemotron_h``) and Nemotron 3
(``nemotron_h_moe``: experts stacked, their router's correction bias ``exp_probs_b``, the shared MLP, Super's latent
projections) GGUF files, written from tiny transformers models the way its converters write them (the layer kinds as
per-layer ``attention.head_count_kv`` and, for Nemotron-H, ``feed_forward_length`` arrays; ``ssm_a = -exp(A_log)``
and ``ssm_d`` as ``[heads, 1]``, the gated norm as ``[groups, width]``, the convolution squeezed; Granite's q/k rows
permuted by its llama converter, its ``rope.scaling.finetuned`` false and ``context_length`` 2**20 for a model
without rope; its experts' and shared MLP's fused input split gate-first), load into the Mamba decoders whose float32
logits equal the HF twin's; the config equals the one read from the model's ``config.json`` but for what the file
says otherwise (the context), torch-free alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf, model_class
from services.engine.weights import load_model_config, load_weights
from services.engine.weights.gguf_loader import unpermute_rope_rows
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.tiny_gguf import (
    F32,
    Q8_0,
    _hf_tensors,
    _load_twin,
    add_metadata,
    add_tensor_as,
    all_f32,
    close_writer,
    hf_logits,
    llama_permute,
    pdserve_logits,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
_GRANITE = dict(model_type="granitemoehybrid", layer_types=["mamba", "attention", "mamba"], num_hidden_layers=3,
                mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2, mamba_d_head=16,
                shared_intermediate_size=64, embedding_multiplier=12.0, attention_multiplier=0.1,
                residual_multiplier=0.5, logits_scaling=2.0, tie_word_embeddings=True)
MODELS = {
    # granite-4.0-h-tiny/-small's kind: experts (the softmax of the top-k) beside the shared MLP, no rope
    "granite-h-moe": dict(_GRANITE, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                          position_embedding_type="nope"),
    # granite-4.0-h-micro's kind: the shared MLP alone; here with rope on the attention layer (Bamba's kind)
    "granite-h-dense": dict(_GRANITE, num_local_experts=0, position_embedding_type="rope", rope_theta=10000.0,
                            tie_word_embeddings=False),
    # Nemotron-H: one mixer a block (Mamba-2, squared-ReLU MLP, attention without rope)
    "nemotron_h": dict(model_type="nemotron_h", layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba"],
                       num_hidden_layers=5, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16,
                       n_groups=2, conv_kernel=4, rms_norm_eps=1e-5, layer_norm_epsilon=1e-5,
                       tie_word_embeddings=False),
    # Nemotron 3 Super's kind: expert blocks in a latent width (Nano's have none), grouped sigmoid routing
    "nemotron_h-moe": dict(model_type="nemotron_h", layers_block_type=["mamba", "moe", "attention", "moe"],
                           num_hidden_layers=4, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16,
                           n_groups=2, conv_kernel=4, rms_norm_eps=1e-5, layer_norm_epsilon=1e-5,
                           n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                           moe_shared_expert_intermediate_size=64, moe_latent_size=32, n_group=2, topk_group=1,
                           routed_scaling_factor=2.5, tie_word_embeddings=False),
}
# a Mamba-2 mixer's and Nemotron-H's block leaves, as llama.cpp names them
_ATTENTION = ("attention", "full_attention")  # transformers' names of an attention layer's kind
_LEAVES = {"in_proj.weight": "ssm_in.weight", "conv1d.weight": "ssm_conv1d.weight", "conv1d.bias": "ssm_conv1d.bias",
           "dt_bias": "ssm_dt.bias", "A_log": "ssm_a", "D": "ssm_d", "norm.weight": "ssm_norm.weight",
           "out_proj.weight": "ssm_out.weight", "q_proj.weight": "attn_q.weight", "k_proj.weight": "attn_k.weight",
           "v_proj.weight": "attn_v.weight", "o_proj.weight": "attn_output.weight", "up_proj.weight": "ffn_up.weight",
           "down_proj.weight": "ffn_down.weight"}


def _model(name: str, **changes):
    model = tiny_hf(**(MODELS[name] | changes))
    with torch.no_grad():  # the step bias and the skip, which tiny_hf leaves as transformers starts them
        for param_name, param in model.named_parameters():
            if param_name.endswith(("dt_bias", ".D")):
                param.copy_(0.5 * torch.randn_like(param))
    return model


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    return Q8_0 if name.endswith(("ssm_in.weight", "ssm_out.weight", "attn_q.weight", "attn_k.weight",
                                  "ffn_up.weight", "ffn_up_exps.weight", "ffn_latent_down.weight")) else F32


def _keys(cfg) -> dict:
    granite = cfg.model_type == "granitemoehybrid"
    kinds = cfg.layer_types if granite else cfg.layers_block_type
    keys = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "attention.head_count": cfg.num_attention_heads,
            "attention.head_count_kv": [cfg.num_key_value_heads if kind in _ATTENTION else 0 for kind in kinds],
            "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
            "vocab_size": cfg.vocab_size, "rope.dimension_count": cfg.hidden_size // cfg.num_attention_heads}
    if granite:
        keys.update({"feed_forward_length": cfg.intermediate_size,
                     "embedding_scale": float(cfg.embedding_multiplier),
                     "residual_scale": float(cfg.residual_multiplier),
                     "attention.scale": float(cfg.attention_multiplier), "logit_scale": float(cfg.logits_scaling),
                     "ssm.conv_kernel": cfg.mamba_d_conv, "ssm.state_size": cfg.mamba_d_state,
                     "ssm.group_count": cfg.mamba_n_groups, "ssm.inner_size": cfg.mamba_expand * cfg.hidden_size,
                     "ssm.time_step_rank": cfg.mamba_n_heads,
                     "expert_shared_feed_forward_length": cfg.shared_intermediate_size})
        if cfg.num_local_experts:
            keys.update({"expert_count": cfg.num_local_experts, "expert_used_count": cfg.num_experts_per_tok})
        if cfg.position_embedding_type != "rope":  # the converter's NoPE: no rope, the context unbounded
            keys["context_length"] = 2 ** 20
    else:  # its converter is Granite 4.0's subclass: NoPE written alike
        keys["context_length"] = 2 ** 20
        widths = {"mlp": cfg.intermediate_size, "moe": cfg.moe_intermediate_size}
        keys.update({"feed_forward_length": [widths.get(kind, 0) for kind in kinds],
                     "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
                     "ssm.conv_kernel": cfg.conv_kernel, "ssm.state_size": cfg.ssm_state_size,
                     "ssm.group_count": cfg.n_groups, "ssm.inner_size": cfg.mamba_num_heads * cfg.mamba_head_dim,
                     "ssm.time_step_rank": cfg.mamba_num_heads})
        if "moe" in kinds:
            keys.update({"expert_count": cfg.n_routed_experts, "expert_used_count": cfg.num_experts_per_tok,
                         "expert_feed_forward_length": cfg.moe_intermediate_size,
                         "expert_shared_feed_forward_length": cfg.moe_shared_expert_intermediate_size,
                         "expert_shared_count": cfg.n_shared_experts, "expert_weights_norm": cfg.norm_topk_prob,
                         "expert_weights_scale": float(cfg.routed_scaling_factor), "expert_group_count": cfg.n_group,
                         "expert_group_used_count": cfg.topk_group})
            if cfg.moe_latent_size is not None:
                keys["moe_latent_size"] = cfg.moe_latent_size
    return keys


def write_hybrid_gguf(model, path: Path, quant=all_f32, keys: dict | None = None) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into ``model``."""
    cfg = model.config
    granite = cfg.model_type == "granitemoehybrid"
    experts = not granite and "moe" in cfg.layers_block_type
    arch = "granitehybrid" if granite else "nemotron_h_moe" if experts else "nemotron_h"
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GRANITE_HYBRID if granite else gguf.MODEL_ARCH.NEMOTRON_H_MOE
                                     if experts else gguf.MODEL_ARCH.NEMOTRON_H, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    add_metadata(writer, arch, {**_keys(cfg), **(keys or {})}, [f"<t{i}>" for i in range(cfg.vocab_size)])
    writer.add_bool(f"{arch}.rope.scaling.finetuned", granite and cfg.position_embedding_type == "rope")
    twin: dict[str, np.ndarray] = {}
    groups = cfg.mamba_n_groups if granite else cfg.n_groups
    for name, array in _hf_tensors(model).items():
        leaf = next((leaf for hf, leaf in _LEAVES.items() if name.endswith((".mamba." + hf, ".mixer." + hf))), None)
        if granite and not cfg.num_local_experts:  # the shared MLP alone is the dense MLP
            gguf_name = names.get_name(name.replace(".mlp.shared_expert.", ".mlp."), try_suffixes=(".weight",))
        elif leaf is not None:
            gguf_name = f"blk.{name.split('.')[2]}.{leaf}"
        elif name.endswith(".norm.weight") and not granite and ".layers." in name:
            gguf_name = f"blk.{name.split('.')[2]}.attn_norm.weight"
        elif name.endswith((".mixer.experts.up_proj", ".mixer.experts.down_proj")):  # stacked by the converter
            gguf_name = names.get_name(name.replace(".mixer.", ".mlp."), try_suffixes=(".weight",)) + ".weight"
        elif name.endswith(".mixer.gate.e_score_correction_bias"):  # renamed "…_correction.bias" by the converter
            gguf_name = f"blk.{name.split('.')[2]}.exp_probs_b.bias"
        else:
            gguf_name = names.get_name(name.replace("model.", "backbone.", 1) if not granite else name,
                                       try_suffixes=(".weight", ".bias"))
        if gguf_name is None and leaf is not None:
            gguf_name = f"blk.{name.split('.')[2]}.{leaf}"
        assert gguf_name is not None, name
        stored_as = {"ssm_a": lambda a: -np.exp(a).reshape(-1, 1), "ssm_d": lambda a: a.reshape(-1, 1),
                     "ssm_norm.weight": lambda a: a.reshape(groups, -1),
                     "ssm_conv1d.weight": lambda a: a[:, 0, :]}.get(leaf or "", lambda a: a)
        back = {"ssm_a": lambda a: np.log(-a).reshape(-1), "ssm_d": lambda a: a.reshape(-1),
                "ssm_norm.weight": lambda a: a.reshape(-1), "ssm_conv1d.weight": lambda a: a[:, None, :]}.get(
            leaf or "", lambda a: a)
        # both converters are llama's subclasses: q/k rows permuted (harmless without rope; undone all the same)
        permuted = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(name.split(".")[-2])
        if permuted:  # rows are quantised alone: the file's rows are the twin's, permuted
            stored = add_tensor_as(writer, gguf_name, llama_permute(array, permuted), quant)
            twin[name] = unpermute_rope_rows(stored, permuted)
        else:
            twin[name] = back(add_tensor_as(writer, gguf_name, stored_as(array), quant))
    close_writer(writer)
    _load_twin(model, twin)
    return path


@pytest.mark.parametrize("quant", [all_f32, _quantised], ids=["f32", "q8_0"])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_hybrid_file_gives_transformers_logits(tmp_path, name, quant):
    model = _model(name)
    path = write_hybrid_gguf(model, tmp_path / f"tiny-{name}.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    expected = config_from_hf(model.config.to_dict())
    assert cfg == dataclasses.replace(expected, name=cfg.name, eos_token_ids=cfg.eos_token_ids,
                                      rms_norm_eps=cfg.rms_norm_eps, max_position=cfg.max_position)
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    served = cfg.served_within(512)  # a NoPE file's 2**20 positions need no rope table that long
    ours = pdserve_logits(model_class(cfg.architecture)(served, weights.tensors, torch.float32), IDS)
    assert torch.allclose(ours, hf_logits(model, IDS), atol=1e-4, rtol=1e-4), (ours - hf_logits(model, IDS)).abs().max()


def test_the_files_read_their_layer_kinds_and_nope(tmp_path):
    granite = load_model_config(write_hybrid_gguf(_model("granite-h-moe"), tmp_path / "g.gguf"))
    assert (granite.mamba.layers, granite.nope_layers, granite.max_position) == ((0, 2), (1,), 2 ** 20)
    assert granite.moe.shared_expert_intermediate_size == 64 and granite.intermediate_size == 64
    dense = load_model_config(write_hybrid_gguf(_model("granite-h-dense"), tmp_path / "d.gguf"))
    assert dense.nope_layers == () and dense.moe is None and dense.mamba.conv_bias
    nemotron = load_model_config(write_hybrid_gguf(_model("nemotron_h"), tmp_path / "n.gguf"))
    assert nemotron.block_kinds == ("mamba", "mlp", "attention", "mlp", "mamba") and nemotron.nope_layers == (2,)


def test_nemotron_3_nano_files_and_their_prediction_block(tmp_path):
    """Nano's kind (no latent width) gives its logits; a file whose last block is the multi-token-prediction one
    (``nextn_predict_layers``, the per-layer arrays one longer) serves the blocks before it; more than one shared MLP
    is refused."""
    model = _model("nemotron_h-moe", moe_latent_size=None)
    path = write_hybrid_gguf(model, tmp_path / "nano.gguf")
    weights = load_weights(path)
    assert weights.config.moe.latent_size is None and weights.config.block_kinds == ("mamba", "moe", "attention", "moe")
    assert weights.config.intermediate_size == 48  # the experts' width: no block is a dense MLP
    ours = pdserve_logits(model_class("nemotron_h")(weights.config.served_within(512), weights.tensors, torch.float32),
                          IDS)
    assert torch.allclose(ours, hf_logits(model, IDS), atol=1e-4, rtol=1e-4)
    keys = {"block_count": 5, "nextn_predict_layers": 1, "attention.head_count_kv": [0, 0, 2, 0, 2],
            "feed_forward_length": [0, 48, 0, 48, 48]}
    with_mtp = load_model_config(write_hybrid_gguf(model, tmp_path / "mtp.gguf", keys=keys))
    assert with_mtp == weights.config
    with pytest.raises(ModelLoadError, match="expert_shared_count 2 is not supported"):
        load_model_config(write_hybrid_gguf(model, tmp_path / "two.gguf", keys={"expert_shared_count": 2}))
    with pytest.raises(ModelLoadError, match="expert_group_count 2 without expert_group_used_count"):
        load_model_config(write_hybrid_gguf(model, tmp_path / "groups.gguf", keys={"expert_group_used_count": 0}))


def test_granite_4_attention_only_files_with_a_per_layer_kv_array_load(tmp_path):
    """granite-4.0-micro's kind (no Mamba layer): llama.cpp's converter names it ``granite`` but still writes
    ``attention.head_count_kv`` per layer; one count everywhere is the model's, differing ones are refused."""
    from tests.engine.tiny_gguf import read_as_the_twin, write_gguf

    model = tiny_hf("granite", tie_word_embeddings=True, embedding_multiplier=12.0, attention_multiplier=0.125,
                    residual_multiplier=0.22, logits_scaling=16.0)
    path = write_gguf(model, tmp_path / "micro.gguf", metadata={"attention.head_count_kv": [2, 2]})
    assert read_as_the_twin(path, model, IDS).num_kv_heads == 2
    mixed = write_gguf(model, tmp_path / "mixed.gguf", metadata={"attention.head_count_kv": [2, 1]})
    with pytest.raises(ModelLoadError, match=r"head_count_kv differs across layers \(\[2, 1\]\)"):
        load_model_config(mixed)


def test_a_per_layer_array_of_another_length_is_refused(tmp_path):
    keys = {"attention.head_count_kv": [0, 2]}
    with pytest.raises(ModelLoadError, match="head_count_kv lists 2 layers, the file has 3"):
        load_model_config(write_hybrid_gguf(_model("granite-h-moe"), tmp_path / "g.gguf", keys=keys))
    keys = {"feed_forward_length": [0, 96, 0, 48, 0]}
    with pytest.raises(ModelLoadError, match="feed_forward_length must list 5 layers of 0 or one width"):
        load_model_config(write_hybrid_gguf(_model("nemotron_h"), tmp_path / "n.gguf", keys=keys))
