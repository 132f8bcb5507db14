"""DeepSeek-V3.2's sparse attention beyond the family test's greedy parity (tests/engine/test_model_families.py):
``DeepseekV32Config``'s shape caches the index key after the latent; the tiny checkpoint's logits are transformers'
past its ``index_topk`` and the indexer's parts are what make them so; the picking (all earlier positions up to
``topk``, the best ``topk`` past it, the earlier position at equal scores) and the sparse path against explicit
masked attention, and a shared layer's reuse of the previous layer's picks; GLM-5's config (interleaved index rope,
shared layers) and logits; CUDA graphs refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.attention.base import write_kv
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import create_backend
from kernels.attention.sparse_index import IndexQuery, SparseIndexAttention, _picked
from services.engine.decode_graphs import graph_support
from services.engine.errors import ModelLoadError
from services.engine.model.dsa_decoder import SparseLatentDecoderModel
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits


def test_the_published_shape_caches_the_index_key_after_the_latent():
    cfg = config_from_hf({"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"]})
    assert (cfg.architecture, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim) == ("deepseek_v32", 61, 1, 64 + 512 + 128)
    index = cfg.mla.index
    assert (index.heads, index.head_dim, index.topk) == (64, 128, 2048)
    assert cfg.rope_interleaved and cfg.rotary_dim == 64 and cfg.mla.q_lora_rank == 1536
    assert cfg.moe.sparse_layers == tuple(range(3, 61)) and cfg.moe.sigmoid_routing and cfg.moe.expert_groups == 8
    assert cfg.kv_bytes_per_token(2) == 2 * 61 * 704 * 2  # the row, and again as the V half


@pytest.fixture(scope="module")
def v32(family_dir):
    path = family_dir("deepseek_v32")
    weights = load_weights(path)
    ids = _prompts()["long"][:120]  # three times the tiny checkpoint's index_topk (40)
    return weights, ids, hf_logits(load_reference(path), ids)


def _logits(weights, ids, config=None, tensors=None) -> torch.Tensor:
    model = SparseLatentDecoderModel(config or weights.config, dict(tensors or weights.tensors), torch.float32)
    return pdserve_logits(model, ids)


def test_the_logits_are_transformers_and_the_indexer_is_what_makes_them_so(v32):
    weights, ids, expected = v32
    assert torch.allclose(_logits(weights, ids), expected, atol=1e-5, rtol=0)
    cfg, tensors = weights.config, weights.tensors
    dense = dataclasses.replace(cfg.mla, index=dataclasses.replace(cfg.mla.index, topk=len(ids)))
    unmade = {
        "the picking (every earlier token attended)": dict(config=dataclasses.replace(cfg, mla=dense)),
        "the index key's LayerNorm bias": dict(tensors={**tensors, **{n: torch.zeros_like(t) for n, t in tensors.items()
                                                                     if n.endswith("indexer.k_norm.bias")}}),
        "the head weights": dict(tensors={**tensors, **{n: t.flip(0) for n, t in tensors.items()
                                                        if n.endswith("indexer.weights_proj.weight")}}),
    }
    for part, change in unmade.items():
        assert not torch.allclose(_logits(weights, ids, **change), expected, atol=1e-3, rtol=0), part
    # up to index_topk tokens every earlier one is picked: the logits are the dense ones there
    short = ids[:40]
    assert torch.allclose(_logits(weights, short), _logits(weights, short, config=dataclasses.replace(cfg, mla=dense)),
                          atol=1e-6, rtol=0)


def _index(scores_by_head: torch.Tensor) -> tuple[IndexQuery, torch.Tensor]:
    """An index whose score of query q for key l is ``scores_by_head[q, l]`` (one head, weight 1): keys are basis
    rows and each query carries its scores."""
    queries, length = scores_by_head.shape
    keys = torch.zeros(length, 1, length)
    keys[:, 0] = torch.eye(length)
    query = IndexQuery(scores_by_head.view(queries, 1, length), torch.ones(queries, 1), 0, 1.0)
    return query, keys


def test_a_query_attends_every_earlier_position_up_to_topk_then_the_best_then_the_earlier_at_equal_scores():
    scores = torch.tensor([[5.0, 1.0, 3.0, 0.0, 0.0, 0.0],
                           [0.0, 0.0, 0.0, 0.0, 2.0, 1.0]])
    query, keys = _index(scores)
    positions = torch.tensor([1, 5])  # the first sees positions 0..1, the second all six
    allowed = _picked(query, 3, 0, 2, keys, positions)
    assert allowed.tolist() == [[True, True, False, False, False, False],  # 2 earlier positions <= topk: both
                                [True, False, False, False, True, True]]  # 4 and 5, then the earliest of the zeros


def test_the_sparse_path_is_explicit_masked_attention_and_short_steps_are_the_backend_s(v32):
    gen = torch.Generator().manual_seed(0)
    block, heads, dim, length = 4, 2, 8, 10
    kv_cache = torch.zeros(4, 2, block, 1, dim)
    meta = AttentionMetadata.build([3], [length], [[2, 0, 3]], block, "cpu")
    attention = SparseIndexAttention(create_backend("torch", "cpu"))
    attention.plan(meta)
    old = torch.randn(length - 3, 1, dim, generator=gen)  # the cached context, K and V the same row (MLA's)
    write_kv(kv_cache, old, old, torch.tensor([[2, 0, 3][p // block] * block + p % block for p in range(length - 3)]))
    q, k = torch.randn(3, heads, dim, generator=gen), torch.randn(3, 1, dim, generator=gen)
    index = IndexQuery(torch.randn(3, 1, 4, generator=gen), torch.ones(3, 1), 4, 1.0)
    out = attention.forward_indexed(q, k, k, kv_cache.clone(), 0.5, index, 5)
    keys = torch.cat((old, k))
    allowed = _picked(index, 5, 0, 3, keys, torch.arange(length - 3, length))
    scores = torch.einsum("qhd,ld->hql", q, keys[:, 0]) * 0.5
    expected = torch.einsum("hql,ld->qhd", scores.masked_fill(~allowed[None], float("-inf")).softmax(-1), keys[:, 0])
    assert torch.allclose(out, expected, atol=1e-6) and allowed.sum(-1).tolist() == [5, 5, 5]
    # a layer sharing the picks (GLM-5's) attends the previous indexed layer's
    assert torch.equal(attention.forward_indexed(q, k, k, kv_cache.clone(), 0.5, None, 5), out)
    # every sequence within topk: the wrapped backend's causal attention, bit for bit
    plain = create_backend("torch", "cpu")
    plain.plan(meta)
    assert torch.equal(attention.forward_indexed(q, k, k, kv_cache.clone(), 0.5, index, length),
                       plain.forward(q, k, k, kv_cache.clone(), 0.5))


def test_cuda_graphs_are_refused_by_name(v32):
    weights, _, _ = v32
    model = SparseLatentDecoderModel(weights.config, dict(weights.tensors), torch.float32)
    assert "sparse attention" in graph_support(model)


def test_glm5_reads_its_interleaved_index_rope_and_its_shared_layers():
    glm5 = config_from_hf({"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"]})
    assert (glm5.architecture, glm5.num_layers, glm5.head_dim) == ("deepseek_v32", 78, 64 + 512 + 128)
    assert glm5.mla.index.interleaved_rope and glm5.mla.index.shared_layers == () and glm5.mla.index.heads == 32
    # every fourth layer from the second on runs an indexer, the others attend its picks (index_topk_freq 4)
    sharing = config_from_hf({"model_type": "glm_moe_dsa", "index_topk_freq": 4, "num_hidden_layers": 10})
    assert sharing.mla.index.shared_layers == (2, 3, 4, 6, 7, 8)
    with pytest.raises(ModelLoadError, match="the first layer must run its own indexer"):
        config_from_hf({"model_type": "glm_moe_dsa", "num_hidden_layers": 3, "indexer_types": ["shared"] * 3})
    with pytest.raises(ModelLoadError, match="indexer_types must list 3 of full, shared"):
        config_from_hf({"model_type": "glm_moe_dsa", "num_hidden_layers": 3, "indexer_types": ["full", "dense"]})


def test_glm5_s_logits_are_transformers_and_its_interleaved_index_rope_is_what_makes_them_so(family_dir):
    path = family_dir("deepseek_v32-glm5")
    weights = load_weights(path)
    assert weights.config.mla.index.shared_layers == (1,)  # its second layer attends the first one's picks
    ids = _prompts()["long"][:120]
    expected = hf_logits(load_reference(path), ids)
    assert torch.allclose(_logits(weights, ids), expected, atol=1e-5, rtol=0)
    half = dataclasses.replace(weights.config.mla.index, interleaved_rope=False)
    rotate_half = dataclasses.replace(weights.config, mla=dataclasses.replace(weights.config.mla, index=half))
    assert not torch.allclose(_logits(weights, ids, config=rotate_half), expected, atol=1e-3, rtol=0)
