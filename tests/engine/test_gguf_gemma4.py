"""Gemma 4 GGUF files (llama.cpp's ``gemma4``), written from tiny transformers models the way its converter writes them
(norms as stored, the experts' fused gate/up kept whole, the router's scales as ``ffn_gate_inp.scale`` and
``ffn_down_exps.scale``, the layer scalar as ``layer_output_scale.weight``, the per-layer inputs' tensors, no
``attn_v`` on a full layer whose values are its keys, nothing of a KV-sharing layer's k/v, the layer kinds as
``attention.sliding_window_pattern``, per-layer arrays where layers differ, the full layers' proportional rope as
``rope_freqs``), load into Gemma 4's decoder whose float32 logits equal the HF twin's (the twin carries the file's
dequantised weights), quantised files too; the config equals the one read from the same model's ``config.json`` and
is read torch-free alike; what llama.cpp reads otherwise than transformers is refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf, model_class
from services.engine.weights import load_weights
from services.engine.weights.gguf_cache_config import config_from_dict
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.tiny_families import _GEMMA4_TEXT
from tests.engine.tiny_gguf import (
    F32,
    Q8_0,
    _load_twin,
    add_metadata,
    all_f32,
    close_writer,
    hf_logits,
    pdserve_logits,
    tensor_adder,
    tiny_hf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]
SLIDING, FULL = "sliding_attention", "full_attention"
TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<turn|>", "<|tool_response>"] + [f"t{i}" for i in range(90)]
# the 31B's and 26B-A4B's kind: full layers' values are their keys, one KV head of the full width, experts beside
# every MLP, the logits capped
DENSE_KIND = dict(layer_types=[SLIDING, FULL, SLIDING, FULL], num_hidden_layers=4, attention_k_eq_v=True,
                  num_global_key_value_heads=1, enable_moe_block=True, num_experts=4, top_k_experts=2,
                  moe_intermediate_size=32, hidden_size_per_layer_input=0, final_logit_softcapping=30.0)
# the E models' kind: the last two layers attend over the last earlier one of their kind (llama.cpp's choice and
# transformers' agree on this order of kinds), with MLPs twice as wide; per-layer inputs of 8; the logits capped as
# every release's are
E_KIND = dict(layer_types=[SLIDING, SLIDING, FULL, SLIDING, FULL], num_hidden_layers=5, num_kv_shared_layers=2,
              use_double_wide_mlp=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=96,
              final_logit_softcapping=30.0)


def _tiny(kind: dict, seed: int = 0):
    model = tiny_hf("gemma4_text", seed=seed, vocab_size=96, **_GEMMA4_TEXT | kind)
    with torch.no_grad():  # the scales a misplaced tensor would leave at 1
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
                tensor.copy_(1 + 0.3 * torch.randn_like(tensor))
    return model


def _quantised(name: str) -> gguf.GGMLQuantizationType:
    """Q8_0 where the rows are whole blocks of 32 (not the per-layer inputs' 8- and 40-wide ones); 1-D tensors, the
    router and the norms F32, as llama.cpp's converter forces them."""
    return F32 if name.endswith(("norm.weight", "ffn_gate_inp.weight", "proj.weight", "per_layer_token_embd.weight")) \
        else Q8_0


def _metadata(cfg: dict) -> dict:
    """The keys llama.cpp's converter writes for a Gemma 4 text config (transformers' dict of it, the full layers'
    heads in its ``per_layer_config``)."""
    layers, kinds = cfg["num_hidden_layers"], list(cfg["layer_types"])
    shared = cfg["num_kv_shared_layers"] or 0
    widths = [cfg["intermediate_size"] * (2 if cfg["use_double_wide_mlp"] and i >= layers - shared else 1)
              for i in range(layers)]
    own = {int(layer): heads for layer, heads in cfg["per_layer_config"].items()}
    kv = [own.get(i, {}).get("num_key_value_heads", cfg["num_key_value_heads"]) for i in range(layers)]
    full = next(own[i]["head_dim"] for i in range(layers) if kinds[i] == FULL)
    ropes, moe = cfg["rope_parameters"], cfg["enable_moe_block"]
    softcap = cfg["final_logit_softcapping"]
    return {"context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
            "block_count": layers, "feed_forward_length": widths if len(set(widths)) > 1 else widths[0],
            "attention.head_count": cfg["num_attention_heads"],
            "attention.head_count_kv": kv if len(set(kv)) > 1 else kv[0],
            "attention.key_length": full, "attention.value_length": full,
            "attention.key_length_swa": cfg["head_dim"], "attention.value_length_swa": cfg["head_dim"],
            "rope.dimension_count": full, "rope.dimension_count_swa": cfg["head_dim"],
            "rope.freq_base": float(ropes[FULL]["rope_theta"]),
            "rope.freq_base_swa": float(ropes[SLIDING]["rope_theta"]),
            "attention.sliding_window": cfg["sliding_window"],
            "attention.sliding_window_pattern": [k == SLIDING for k in kinds], "attention.shared_kv_layers": shared,
            "embedding_length_per_layer_input": cfg["hidden_size_per_layer_input"],
            "attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
            "final_logit_softcapping": None if softcap is None else float(softcap),
            "expert_count": cfg["num_experts"] if moe else None,
            "expert_used_count": cfg["top_k_experts"] if moe else None,
            "expert_feed_forward_length": cfg["moe_intermediate_size"] if moe else None}


def write_gemma4_gguf(model, path: Path, quant=all_f32, keys: dict | None = None, rope_freqs: bool = True) -> Path:
    """``model`` as llama.cpp's converter writes it, and the file's dequantised values loaded into ``model``."""
    cfg = model.config.to_dict()  # the full layers' heads are in its per_layer_config (transformers' writing)
    layers, shared = cfg["num_hidden_layers"], cfg["num_kv_shared_layers"] or 0
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, layers)
    writer = gguf.GGUFWriter(str(path), "gemma4")
    add_metadata(writer, "gemma4", _metadata(cfg) | (keys or {}), TOKENS)
    add = tensor_adder(writer, names, quant)
    twin: dict[str, np.ndarray] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        array = tensor.detach().numpy()
        if "rotary_emb" in name or name.endswith("embed_scale") or name == "lm_head.weight":
            continue
        layer = int(name.split(".")[2]) if ".layers." in name else -1
        if shared and layer >= layers - shared and (".self_attn.k_" in name or ".self_attn.v_" in name):
            continue  # a KV-sharing layer's own k/v: not in the released checkpoints
        if name.endswith(("router.scale", "router.per_expert_scale", "layer_scalar")):
            gguf_name = {"router.scale": f"blk.{layer}.ffn_gate_inp.scale",
                         "router.per_expert_scale": f"blk.{layer}.ffn_down_exps.scale",
                         "layer_scalar": f"blk.{layer}.layer_output_scale.weight"}[name.split(".", 3)[-1]]
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
            twin[name] = array
            continue
        twin[name] = add(name + ".weight" if ".experts." in name else name, array)  # the converter adds .weight
    width = next(heads["head_dim"] for heads in cfg["per_layer_config"].values())  # the full layers'
    angles = int(width * cfg["rope_parameters"][FULL]["partial_rotary_factor"] / 2)
    if rope_freqs:
        writer.add_tensor("rope_freqs.weight", np.array([1.0] * angles + [1e30] * (width // 2 - angles),
                                                        dtype=np.float32))
    close_writer(writer)
    _load_twin(model, twin)
    return path


@pytest.mark.parametrize(("kind", "quant"), [(DENSE_KIND, all_f32), (E_KIND, all_f32), (DENSE_KIND, _quantised),
                                             (E_KIND, _quantised)], ids=["dense", "e", "dense-q8", "e-q8"])
def test_a_gemma4_file_gives_transformers_logits(tmp_path, kind, quant):
    model = _tiny(kind)
    path = write_gemma4_gguf(model, tmp_path / "tiny-gemma4.gguf", quant)
    weights = load_weights(path)
    cfg = weights.config
    hf = config_from_hf(model.config.to_dict())
    hf = dataclasses.replace(hf, name=cfg.name, eos_token_ids=cfg.eos_token_ids, rms_norm_eps=cfg.rms_norm_eps,
                             rope_scaling=dataclasses.replace(hf.rope_scaling, original_max_position=None))
    # the file says what config.json says, but the name, its EOS ids, its float32 epsilon and an original context the
    # proportional rope does not use
    assert cfg == hf
    assert cfg.gemma4.value_is_key == ((1, 3) if kind is DENSE_KIND else ())
    assert cfg.gemma4.shared_layers == (() if kind is DENSE_KIND else (3, 4))
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), IDS)
    theirs = hf_logits(model, IDS)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    assert config_from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg  # the GGUF weights cache's


def test_turns_end_at_its_turn_and_tool_response_tokens(tmp_path):
    path = write_gemma4_gguf(_tiny(E_KIND), tmp_path / "tiny-gemma4.gguf")
    assert read_gguf_config(path).eos_token_ids == (2, 4, 5)  # the file's EOS, <turn|>, <|tool_response>


@pytest.mark.parametrize(("kind", "keys", "named"), [
    # transformers' E-model order of kinds: the shared sliding layer would read layer 1 in llama.cpp, 2 here
    (E_KIND | dict(layer_types=[SLIDING, FULL, SLIDING, SLIDING, FULL]), {},
     r"llama.cpp's layer 3 attends over layer 1's KV, transformers' over layer 2's"),
    (E_KIND, {"attention.sliding_window_pattern": [True, False]}, "must list each of the 5 layers"),
    (E_KIND, {"rope.dimension_count_swa": 8}, "a rope over part of a head"),
    (E_KIND, {"attention.value_length_swa": 8}, "value widths differ from the key widths"),
    (E_KIND, {"attention.head_count_kv": [2, 2]}, "head_count_kv lists 2 values for 5 layers"),
    (E_KIND, {"feed_forward_length": [128, 256, 128, 256, 256]}, "not one width, doubled on KV-sharing layers only"),
    (E_KIND, {"embedding_length_per_layer_input": None}, "lacks gemma4.embedding_length_per_layer_input"),
])
def test_what_llama_cpp_reads_otherwise_is_refused_by_name(tmp_path, kind, keys, named):
    path = write_gemma4_gguf(_tiny(kind), tmp_path / "tiny-gemma4.gguf", keys=keys)
    with pytest.raises(ModelLoadError, match=named):
        read_gguf_config(path)


def test_missing_keys_take_llama_cpp_s_defaults(tmp_path):
    """A file without ``final_logit_softcapping`` is capped at 30 and one with 0 is not (llama.cpp's default and its
    "off"); without ``rope.freq_base_swa`` the sliding layers rotate with the full layers' base."""
    model = _tiny(E_KIND)
    cfg = read_gguf_config(write_gemma4_gguf(model, tmp_path / "a.gguf", keys={"final_logit_softcapping": None,
                                                                                 "rope.freq_base_swa": None}))
    assert cfg.gemma4.final_logit_softcap == 30.0 and cfg.local_rope_theta == cfg.rope_theta == 1000000.0
    cfg = read_gguf_config(write_gemma4_gguf(model, tmp_path / "b.gguf", keys={"final_logit_softcapping": 0.0}))
    assert cfg.gemma4.final_logit_softcap is None and cfg.local_rope_theta == 10000.0


def test_a_file_without_rope_freqs_is_refused(tmp_path):
    path = write_gemma4_gguf(_tiny(E_KIND), tmp_path / "tiny-gemma4.gguf", rope_freqs=False)
    with pytest.raises(ModelLoadError, match=r"proportional rope needs the 'rope_freqs\.weight' tensor"):
        read_gguf_config(path)


def test_rope_freqs_that_are_not_a_proportional_rope_are_refused(tmp_path):
    from services.engine.weights.gguf_metadata import complete_config

    cfg = read_gguf_config(write_gemma4_gguf(_tiny(E_KIND), tmp_path / "tiny-gemma4.gguf"))
    assert cfg.rope_scaling.rotated_fraction == 0.25 and cfg.rope_scaling.freq_factors is None
    with pytest.raises(ModelLoadError, match="must be 1 for the pairs that rotate"):
        complete_config(cfg, set(), np.array([1.0] * 4 + [2.0] * 12, dtype=np.float32))


def test_a_gemma4_file_s_tokenizer_is_read_as_transformers_reads_it(tmp_path, monkeypatch):
    """transformers reads llama.cpp's ``gemma4`` tokenizer (a BPE over ``▁``-spelled pieces with the file's merges)
    by name; as transformers' own Gemma 4 tokenizer, it adds no BOS (the chat template writes ``<bos>``; llama.cpp
    adds one itself)."""
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    tokens = [*TOKENS[:6], "▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "ll", "llo", "▁hello", "▁w", "or",
              "▁wor", "▁worl", "▁world"]
    writer = gguf.GGUFWriter(str(tmp_path / "gemma4-tokenizer.gguf"), "gemma4")
    add_metadata(writer, "gemma4", {"block_count": 1}, tokens)
    writer.add_tokenizer_model("gemma4")
    writer.add_token_merges(["▁ h", "▁h e", "l l", "ll o", "▁he llo", "▁ w", "o r", "▁w or", "▁wor l", "▁worl d"])
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    close_writer(writer)
    loaded = Tokenizer.load(tmp_path / "gemma4-tokenizer.gguf")
    ids = loaded.hf.encode(" hello world")
    assert loaded.hf.convert_ids_to_tokens(ids) == ["▁hello", "▁world"]
