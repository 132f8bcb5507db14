"""DeepSeek-V3.2's sparse attention beyond the family test's greedy parity (tests/engine/test_model_families.py):
``DeepseekV32Config``'s shape caches the index key after the latent; the tiny checkpoint's logits are transformers'
past its ``index_topk`` and the indexer's parts are what make them so; the picking (all earlier positions up to
``topk``, the best ``topk`` past it, the earlier position at equal scores) and the sparse path against a query-by-
query brute force over several sequences (a cached context, a decode; GQA; in blocks), and a shared layer's reuse of
the previous layer's picks; GLM-5's config (interleaved index rope, shared layers) and logits; CUDA graphs refused
by name."""

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
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe


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
    # three times the tiny checkpoint's index_topk (40)
    return exactness_probe(family_dir("deepseek_v32"), _prompts()["long"][:120])


def _dense(config):
    """``config`` with an index_topk past the test prompts: every earlier token picked."""
    return dataclasses.replace(config, mla=dataclasses.replace(
        config.mla, index=dataclasses.replace(config.mla.index, topk=1000)))


def test_the_logits_are_transformers_and_the_indexer_is_what_makes_them_so(v32):
    weights, expected, logits = v32
    tensors = weights.tensors
    assert_each_part_matters(logits, expected, {
        "the picking (every earlier token attended)": dict(config=_dense(weights.config)),
        "the index key's LayerNorm bias": dict(tensors={**tensors, **{n: torch.zeros_like(t) for n, t in tensors.items()
                                                                     if n.endswith("indexer.k_norm.bias")}}),
        "the head weights": dict(tensors={**tensors, **{n: t.flip(0) for n, t in tensors.items()
                                                        if n.endswith("indexer.weights_proj.weight")}}),
    })


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


def _brute_force(q, rows, index_q, weights, topk, positions, scale, previous=None):
    """The sparse attention of one sequence's queries computed query by query in plain Python order: its picks
    (index dims 4.. of each row; equal scores: the earlier position) and the attention over them, each query head
    reading its KV head's rows (``previous``: reuse those picks)."""
    heads, kv_heads = q.shape[1], rows.shape[1]
    out, picks = torch.zeros_like(q), []
    for j, p in enumerate(positions):
        if previous is None:
            scores = [sum(float(weights[j, h]) * max(0.0, float(index_q[j, h] @ rows[t, 0, 4:]) * 0.5)
                          for h in range(index_q.shape[1])) for t in range(p + 1)]
            chosen = sorted(range(p + 1), key=lambda t, scores=scores: (-scores[t], t))[:topk]
        else:
            chosen = previous[j]
        picks.append(chosen)
        for h in range(heads):
            kv = h // (heads // kv_heads)
            logits = torch.stack([q[j, h] @ rows[t, kv] * scale for t in chosen])
            out[j, h] = logits.softmax(0) @ rows[chosen, kv]
    return out, picks


def test_the_sparse_path_is_per_query_brute_force_over_several_sequences_and_blocks(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    block, heads, kv_heads, dim, topk = 4, 4, 2, 8, 5
    tables = [[2, 0, 3], [1, 4, 5]]
    meta = AttentionMetadata.build([3, 1], [10, 9], tables, block, "cpu")  # a chunk after 7 cached tokens; a decode
    context = {0: torch.randn(7, kv_heads, dim, generator=gen), 1: torch.randn(8, kv_heads, dim, generator=gen)}
    kv_cache = torch.zeros(6, 2, block, kv_heads, dim)
    for seq, rows in context.items():  # K and V the same rows here, as latent attention caches them
        slots = torch.tensor([tables[seq][p // block] * block + p % block for p in range(len(rows))])
        write_kv(kv_cache, rows, rows, slots)
    q, k = torch.randn(4, heads, dim, generator=gen), torch.randn(4, kv_heads, dim, generator=gen)
    index = IndexQuery(torch.randn(4, 3, 4, generator=gen), torch.randn(4, 3, generator=gen), 4, 0.5)
    expected, picks = [], []
    for seq, (start, stop, positions) in enumerate(((0, 3, [7, 8, 9]), (3, 4, [8]))):
        rows = torch.cat((context[seq], k[start:stop]))
        out, chosen = _brute_force(q[start:stop], rows, index.q[start:stop], index.weights[start:stop], topk,
                                   positions, 0.3)
        expected.append(out)
        picks.append((rows, chosen))
    for per_block in (1 << 25, 1):  # the whole sequence at once, and one query a block
        monkeypatch.setattr("kernels.attention.sparse_index.SCORES_PER_BLOCK", per_block)
        attention = SparseIndexAttention(create_backend("torch", "cpu"))
        attention.plan(meta)
        out = attention.forward_indexed(q, k, k, kv_cache.clone(), 0.3, index, topk)
        assert torch.allclose(out, torch.cat(expected), atol=1e-5)
        # a layer sharing the picks (GLM-5's) attends the previous indexed layer's, with its own queries
        q2 = torch.randn(4, heads, dim, generator=gen)
        shared = attention.forward_indexed(q2, k, k, kv_cache.clone(), 0.3, None, topk)
        reused = [_brute_force(q2[s:e], rows, None, None, topk, pos, 0.3, previous=chosen)[0]
                  for (s, e, pos), (rows, chosen) in zip(((0, 3, [7, 8, 9]), (3, 4, [8])), picks, strict=True)]
        assert torch.allclose(shared, torch.cat(reused), atol=1e-5)


def test_a_step_within_topk_is_the_wrapped_backend_s_attention_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    meta = AttentionMetadata.build([3], [3], [[0]], 4, "cpu")
    q, k = torch.randn(3, 2, 8, generator=gen), torch.randn(3, 1, 8, generator=gen)
    index = IndexQuery(torch.randn(3, 1, 4, generator=gen), torch.ones(3, 1), 4, 1.0)
    sparse, plain = SparseIndexAttention(create_backend("torch", "cpu")), create_backend("torch", "cpu")
    sparse.plan(meta)
    plain.plan(meta)
    assert torch.equal(sparse.forward_indexed(q, k, k, torch.zeros(1, 2, 4, 1, 8), 0.5, index, 3),
                       plain.forward(q, k, k, torch.zeros(1, 2, 4, 1, 8), 0.5))


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
    weights, expected, logits = exactness_probe(family_dir("deepseek_v32-glm5"), _prompts()["long"][:120])
    assert weights.config.mla.index.shared_layers == (1,)  # its second layer attends the first one's picks
    half = dataclasses.replace(weights.config.mla.index, interleaved_rope=False)
    rotate_half = dataclasses.replace(weights.config, mla=dataclasses.replace(weights.config.mla, index=half))
    assert_each_part_matters(logits, expected, {"the interleaved index rope": dict(config=rotate_half)})
