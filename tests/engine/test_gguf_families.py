"""GGUF files of every GGUF family (``llama`` with Mixtral's experts too, ``granite``, ``granitemoe``, ``qwen2``,
``qwen3``, ``qwen2moe``, ``qwen3moe``, ``gemma``, ``gemma2``, ``gemma3``; ``gpt-oss``'s in
tests/engine/test_gguf_gpt_oss.py), written the way llama.cpp writes them from tiny transformers models, load into a
``DecoderModel`` whose float32 logits equal the HF twin's (the twin carries the file's dequantised weights, so
quantised files are held to the same bar); what the loader cannot serve exactly is refused with the culprit named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.int4_linear import int4_supported
from kernels.rope_frequencies import rope_frequencies
from services.engine.errors import ModelLoadError
from services.engine.model.decoder import DecoderModel
from services.engine.model.registry import model_class
from services.engine.weights import load_model_config, load_weights
from services.engine.weights.gguf_metadata import read_gguf_config
from tests.engine.tiny_gguf import (
    Q4_0,
    all_f32,
    hf_logits,
    llama3_rope_freqs,
    mixed,
    pdserve_logits,
    tiny_hf,
    write_gguf,
)

IDS = [(i * 37 + 5) % 96 for i in range(45)]  # 45 tokens: three KV blocks of 16
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)
FAMILIES = {
    "qwen3": dict(model_type="qwen3", head_dim=16, tie_word_embeddings=True),  # explicit head_dim, q/k norms
    "qwen3-wide-heads": dict(model_type="qwen3", head_dim=32, tie_word_embeddings=False),  # head_dim ≠ hidden/heads
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=False, rope_theta=1000000.0),  # q/k/v biases
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True, tie_word_embeddings=False),
    # Qwen2-MoE as llama.cpp's qwen2moe: experts beside a gated shared expert on every layer, q/k/v biases
    "qwen2_moe": dict(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, tie_word_embeddings=False),
    "llama": dict(model_type="llama", tie_word_embeddings=True),
    # Granite as llama.cpp writes it: q/k rows permuted (its converter is the llama one's subclass), the multipliers
    # as *_scale keys
    "granite": dict(model_type="granite", tie_word_embeddings=True, embedding_multiplier=12.0,
                    attention_multiplier=0.125, residual_multiplier=0.22, logits_scaling=16.0),
    # Granite MoE as llama.cpp's granitemoe: Granite's scalars and permuted q/k, the stacked experts split into
    # ffn_{gate,up,down}_exps, the router's top-k softmaxed; with a shared MLP (no gate) split into _shexp
    "granitemoe": dict(model_type="granitemoe", num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=True,
                       embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.22,
                       logits_scaling=16.0),
    "granitemoeshared": dict(model_type="granitemoeshared", num_local_experts=4, num_experts_per_tok=2,
                             shared_intermediate_size=64, tie_word_embeddings=False, embedding_multiplier=12.0,
                             attention_multiplier=0.125, residual_multiplier=0.22, logits_scaling=16.0),
    # Mixtral as llama.cpp writes it: the llama architecture with expert_count, q/k rows permuted
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False),
    # Arcee's AFM as llama.cpp writes it: its llama converter's subclass (q/k rows permuted), no gate projection
    "arcee": dict(model_type="arcee", tie_word_embeddings=False),
    # EXAONE 3.5 as llama.cpp writes it: Llama's layer, nothing permuted, its llama3 scaling as rope_freqs
    "exaone": dict(model_type="exaone", tie_word_embeddings=False, rope_scaling=LLAMA3),
    # Llama 3.1+ with attention biases: rope_freqs, q/k rows (and biases) permuted by the converter
    "llama3-bias": dict(model_type="llama", attention_bias=True, tie_word_embeddings=False, rope_scaling=LLAMA3),
    # Gemma 1 as llama.cpp reads it: its norms stored as 1 + weight, none after the blocks, queries by head_dim
    "gemma": dict(model_type="gemma", head_dim=32, tie_word_embeddings=True),
    # Gemma 2 as llama.cpp reads it: sliding (window 8 < the 45 tokens) and full layers alternating, queries
    # scaled by head_dim, softcaps low enough to matter in a tiny model
    "gemma2": dict(model_type="gemma2", num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                   attn_logit_softcapping=3.0, final_logit_softcapping=5.0, tie_word_embeddings=True),
    # Gemma 3 as llama.cpp reads it: six layers (five sliding, window 8 < the 45 tokens), queries scaled by
    # head_dim, the 4B+ models' linear rope scaling on the full layer
    "gemma3": dict(model_type="gemma3_text", num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16,
                   sliding_window=8, tie_word_embeddings=True,
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
}


def _write(name: str, tmp_path, quant=all_f32, **kwargs):
    spec = dict(FAMILIES[name])
    hf = tiny_hf(spec.pop("model_type"), **spec)
    if spec.get("rope_scaling"):
        kwargs.setdefault("extra", {})["rope_freqs.weight"] = llama3_rope_freqs(hf.config)
    return hf, write_gguf(hf, tmp_path / f"{name}.gguf", quant, **kwargs)


@pytest.mark.parametrize("quant", [all_f32, mixed], ids=["f32", "q8-q4-f16"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_gguf_forward_equals_its_hf_twin(name, quant, tmp_path):
    hf, path = _write(name, tmp_path, quant)
    weights = load_weights(path)
    assert weights.config == load_model_config(path)  # the weights cache's copy of the config agrees
    assert weights.config == read_gguf_config(path)  # and so does the file's metadata alone (the gateway's read)
    model = model_class(weights.config.architecture)(weights.config, weights.tensors, torch.float32)
    expected, actual = hf_logits(hf, IDS), pdserve_logits(model, IDS)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=2e-5)
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))


def test_experts_are_split_per_expert_and_keep_their_4bit_codes(tmp_path):
    """Each slice of ``ffn_*_exps`` is one expert's [out, in] matrix; Q4 codes decode to the same values."""
    hf, path = _write("qwen3_moe", tmp_path, lambda n: Q4_0 if "_exps" in n else all_f32(n))
    weights = load_weights(path, keep_q4=True)
    cfg = weights.config
    assert cfg.moe is not None and cfg.moe.num_experts == 4 and cfg.moe.sparse_layers == (0, 1)
    assert len(weights.quantized) == cfg.num_layers * cfg.moe.num_experts * 3
    for name, codes in weights.quantized.items():
        assert torch.equal(codes.dequantize(), weights.tensors[name]), name
    fused = hf.state_dict()["model.layers.1.mlp.experts.gate_up_proj"][2]  # expert 2: [gate; up] rows
    torch.testing.assert_close(weights.tensors["model.layers.1.mlp.experts.2.up_proj.weight"], fused[32:],
                               rtol=0, atol=0)
    assert weights.tensors["model.layers.1.mlp.experts.2.down_proj.weight"].shape == (cfg.hidden_size, 32)


@pytest.mark.skipif(not int4_supported("cpu", torch.bfloat16), reason="no int4 CPU kernel in torch")
def test_bf16_on_the_experts_4bit_codes_tracks_float32(tmp_path):
    _, path = _write("qwen3_moe", tmp_path, mixed)
    weights = load_weights(path, keep_q4=True)
    int4 = DecoderModel(weights.config, weights.tensors, torch.bfloat16, quantized=weights.quantized,
                        int4_max_rows=64)
    assert int4.int4_max_rows == 64 and int4.layers[0].moe.down[0].int4 is not None
    reference = pdserve_logits(DecoderModel(weights.config, weights.tensors, torch.float32), IDS[:8])
    assert (pdserve_logits(int4, IDS[:8]) - reference).abs().max() < 0.25


def test_rope_freqs_give_transformers_llama3_frequencies(tmp_path):
    """llama.cpp's converter turns the llama3 scaling into ``rope_freqs`` (no rope.scaling.* metadata):
    dividing inv_freq by them gives transformers' llama3 inv_freq, and the logits depend on them."""
    hf, path = _write("llama3-bias", tmp_path)
    config = load_weights(path).config
    assert config.rope_scaling is not None and config.rope_scaling.freq_factors is not None
    inv_freq, attention_factor = rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    torch.testing.assert_close(inv_freq, hf.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
    assert attention_factor == 1.0
    unscaled, _ = rope_frequencies(config.head_dim, config.rope_theta)
    assert not torch.allclose(inv_freq, unscaled)  # the test's context range does reach the scaled band


def test_a_llama_gguf_without_rope_freqs_is_plain_rope(tmp_path):
    hf = tiny_hf("llama", tie_word_embeddings=True)
    config = load_weights(write_gguf(hf, tmp_path / "plain.gguf")).config
    assert config.rope_scaling is None and config.tie_word_embeddings and not config.qkv_bias


def test_missing_vocab_size_is_counted_from_the_embedding(tmp_path):
    hf, path = _write("qwen3", tmp_path, vocab_size=False)
    weights = load_weights(path)
    assert weights.config.vocab_size == hf.config.vocab_size == load_model_config(path).vocab_size
    model = DecoderModel(weights.config, weights.tensors, torch.float32)
    torch.testing.assert_close(pdserve_logits(model, IDS), hf_logits(hf, IDS), rtol=1e-5, atol=2e-5)


def test_redundant_rotary_buffers_are_skipped(tmp_path):
    """Old conversions stored rope's inv_freq per layer (``attn_rot_embd``): recomputed, not refused."""
    hf, path = _write("qwen3", tmp_path, extra={"blk.0.attn_rot_embd": np.ones(8, dtype=np.float32)})
    weights = load_weights(path)
    model = DecoderModel(weights.config, weights.tensors, torch.float32)
    torch.testing.assert_close(pdserve_logits(model, IDS), hf_logits(hf, IDS), rtol=1e-5, atol=2e-5)


def test_unknown_architecture_is_refused_by_name(tmp_path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for load in (load_weights, load_model_config):
        with pytest.raises(ModelLoadError,
                           match=r"gpt2.*supported: llama, smollm3, llama4, granite, granitehybrid, jamba, falcon-h1, "
                                 r"lfm2, lfm2moe, "
                                 r"nemotron_h, nemotron_h_moe, mamba, mamba2, granitemoe, starcoder2, phi2, gptneox, "
                                 r"nemotron, arcee, "
                                 r"qwen2, "
                                 r"qwen3, "
                                 r"seed_oss, "
                                 r"mistral3, "
                                 r"qwen2moe, qwen3moe, qwen2vl, qwen3vl, qwen3vlmoe, phi3, gpt-oss, glm4, olmo2, "
                                 r"olmoe, hunyuan-dense, hunyuan-moe, dots1, exaone, exaone4, command-r, cohere2, "
                                 r"ernie4_5, ernie4_5-moe, glm4moe, deepseek2, mistral4, minimax-m2, qwen35, "
                                 r"qwen35moe, qwen3next, gemma, gemma2, gemma3, gemma4$"):
            load(path)


@pytest.mark.parametrize("tensor", ["blk.1.ffn_gate_shexp.weight", "blk.0.attn_qkv.weight", "cls.weight"])
def test_unknown_tensor_is_refused_by_name(tensor, tmp_path):
    """A shared expert, a fused qkv, a classifier head: features pdserve would otherwise silently drop."""
    _, path = _write("qwen3", tmp_path, extra={tensor: np.zeros((4, 64), dtype=np.float32)})
    for load in (load_weights, load_model_config):
        with pytest.raises(ModelLoadError, match=tensor.replace(".", r"\.")):
            load(path)


def test_a_type_the_gguf_package_cannot_dequantize_is_refused_naming_tensor_and_type(tmp_path):
    _, path = _write("qwen3", tmp_path, extra={"rope_freqs.weight": np.ones(8, dtype=np.int32)})
    with pytest.raises(ModelLoadError, match=r"rope_freqs\.weight.*I32"):
        load_weights(path)


def test_a_type_number_the_gguf_package_does_not_know_is_refused(tmp_path):
    from gguf import GGUFReader

    _, path = _write("qwen3", tmp_path)
    info = GGUFReader(str(path)).tensors[3].field  # name length, name, n_dims, dims, type, offset
    at = info.offset + sum(part.nbytes for part in info.parts[:4])
    data = bytearray(path.read_bytes())
    data[at:at + 4] = np.uint32(77).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"quant type the gguf package does not know.*77"):
        load_weights(path)


def test_rope_freqs_of_the_wrong_length_are_refused(tmp_path):
    _, path = _write("qwen3", tmp_path, extra={"rope_freqs.weight": np.ones(5, dtype=np.float32)})
    with pytest.raises(ModelLoadError, match=r"rope_freqs.*5 factors.*needs 8"):
        load_weights(path)


def test_mixtral_with_one_tensor_per_expert_equals_its_hf_twin(tmp_path):
    """Mixtral files converted before llama.cpp stacked the experts (``blk.N.ffn_gate.E.weight``), which
    llama.cpp still loads, quantised as such files are."""
    hf, path = _write("mixtral", tmp_path, mixed, one_tensor_per_expert=True)
    weights = load_weights(path, keep_q4=True)
    assert weights.config.moe is not None and weights.config.moe.num_experts == 4 and weights.config.moe.top_k == 2
    assert weights.config.moe.intermediate_size == 96 and weights.config.moe.norm_topk_prob
    down = "model.layers.1.mlp.experts.3.down_proj.weight"
    assert torch.equal(weights.quantized[down].dequantize(), weights.tensors[down])  # its 4-bit codes kept
    model = DecoderModel(weights.config, weights.tensors, torch.float32)
    torch.testing.assert_close(pdserve_logits(model, IDS), hf_logits(hf, IDS), rtol=1e-5, atol=2e-5)


def test_experts_in_a_dense_family_are_refused(tmp_path):
    """A llama-architecture GGUF with a router but no ``llama.expert_count``: not Mixtral, so the router is
    left over and refused by name rather than ignored."""
    _, path = _write("llama", tmp_path, extra={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64), dtype=np.float32)})
    weights = load_weights(path)
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.mlp\.gate\.weight"):
        DecoderModel(weights.config, weights.tensors, torch.float32)


def test_a_gemma3_file_without_an_eot_id_ends_turns_at_its_end_of_turn_token(tmp_path):
    """Converters write ``tokenizer.ggml.eot_token_id`` only sometimes; llama.cpp finds ``<end_of_turn>`` by its
    text, and so does the loader (else generation would run past the end of a chat turn)."""
    tokens = [f"<t{i}>" for i in range(96)]
    tokens[7] = "<end_of_turn>"
    _, path = _write("gemma3", tmp_path, tokens=tokens)
    assert load_weights(path).config.eos_token_ids == (2, 7)
    assert read_gguf_config(path).eos_token_ids == (2, 7)


def test_an_early_qwen2moe_file_without_its_expert_widths_takes_llama_cpps_fallbacks(tmp_path):
    """Early Qwen1.5-MoE conversions lack ``expert_feed_forward_length`` and ``expert_shared_feed_forward_length``:
    llama.cpp takes ``feed_forward_length / expert_used_count`` and ``feed_forward_length``."""
    hf, path = _write("qwen2_moe", tmp_path, metadata={"feed_forward_length": 64, "expert_feed_forward_length": None,
                                                        "expert_shared_feed_forward_length": None})
    moe = load_model_config(path).moe
    assert (moe.intermediate_size, moe.shared_expert_intermediate_size) == (32, 64)
    weights = load_weights(path)
    model = DecoderModel(weights.config, weights.tensors, torch.float32)
    torch.testing.assert_close(pdserve_logits(model, IDS), hf_logits(hf, IDS), rtol=1e-5, atol=2e-5)
