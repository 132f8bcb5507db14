"""Decode graphs on the CPU (``decode_graphs``): the buckets, what cannot be captured, and the real bundled
model decoding through the fixed buffers and padding a graph replays, token for token as the eager engine
(float32), with ``eager_capture`` standing in for the capture itself (which only a GPU test can check:
``tests/e2e/test_gpu_cluster.py``, ``tests/engine/test_decode_graphs_gpu.py``)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from kernels.attention.metadata import AttentionMetadata
from services.engine.config import EngineConfig
from services.engine.decode_graphs import BUCKETS, GraphOptions, buckets_for, eager_capture, graph_support
from services.engine.model.decoder import DecoderModel
from services.engine.model_runner import ModelRunner
from services.engine.random_llama import PRESETS, random_tensors
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.kernels import fake_flashinfer

PROMPTS = ["Hello", "The capital of France is", "def fib(n):", "Once upon a time, in a land far away,",
           "1, 2, 3, 4,"]


def test_buckets_cover_max_num_seqs_and_stop_at_256():
    assert buckets_for(1) == (1,)
    assert buckets_for(8) == (1, 2, 4, 8)
    assert buckets_for(100) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert buckets_for(128) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert buckets_for(1000) == BUCKETS


def test_what_a_graph_cannot_hold_is_named():
    layer = SimpleNamespace(moe=None)
    full = SimpleNamespace(has_windows=False, attention_sinks=False, attn_logit_softcap=None, gemma4=None,
                           attention_chunk=None, mla=None)

    def model(layers, deterministic=False, config=full):
        return SimpleNamespace(deterministic=deterministic, layers=layers, config=config)

    assert graph_support(model([layer])) == ""
    assert "deterministic" in graph_support(model([layer], deterministic=True))
    looped = model([layer, SimpleNamespace(moe=SimpleNamespace(grouped=None))])
    assert "mixture-of-experts layers route tokens on the host" in graph_support(looped)
    grouped = model([layer, SimpleNamespace(moe=SimpleNamespace(grouped=1))])
    assert graph_support(grouped) == ""  # grouped experts: no host sync, capturable
    windowed = SimpleNamespace(**vars(full) | {"has_windows": True})
    assert "sliding-window layers" in graph_support(model([layer], config=windowed))
    chunked = SimpleNamespace(**vars(full) | {"attention_chunk": 8192})
    assert "chunked-attention layers" in graph_support(model([layer], config=chunked))
    assert "attention sinks" in graph_support(model([layer], config=SimpleNamespace(**vars(full) | {
        "attention_sinks": True})))
    capped = SimpleNamespace(**vars(full) | {"attn_logit_softcap": 50.0})
    assert "attention logit softcapping" in graph_support(model([layer], config=capped))
    gemma4 = SimpleNamespace(**vars(full) | {"gemma4": object()})  # (its layers have no ``moe``: checked first)
    assert "heads differ in number and width" in graph_support(model([SimpleNamespace()], config=gemma4))
    dense_latent = SimpleNamespace(**vars(full) | {"mla": SimpleNamespace(index=None)})  # DeepSeek-V3's: capturable
    assert graph_support(model([layer], config=dense_latent)) == ""
    indexed = SimpleNamespace(**vars(full) | {"mla": SimpleNamespace(index=object())})  # DeepSeek-V3.2's
    assert "sparse attention" in graph_support(model([SimpleNamespace()], config=indexed))


def test_cuda_graphs_need_a_cuda_device():
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device, not 'cpu'"):
        EngineConfig(model_path="m", cuda_graphs=True)


def test_the_bundled_model_decodes_through_padded_buckets_as_the_eager_engine_does(fp32_model, bundled_tokenizer):
    prompts = [bundled_tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    settings = {"max_num_seqs": 8, "max_model_len": 256}
    eager = make_engine(fp32_model, bundled_tokenizer, **settings)
    graphed = make_engine(fp32_model, bundled_tokenizer, graph_capture=eager_capture, **settings)
    runner = graphed.runner
    assert runner.graphs is not None and runner.graphs.buckets == (1, 2, 4, 8)
    assert runner.graphs.attention.name == "torch"  # no flashinfer on a CPU
    sink = graphed.kv.num_blocks
    assert runner.kv_cache.shape[1] == sink + 1  # the sink: one block past the pool's
    expected = [r.token_ids for r in eager.generate(prompts, params)]
    assert [r.token_ids for r in graphed.generate(prompts, params)] == expected
    # and one at a time (bucket 1), then three (padded to 4)
    assert [graphed.generate([p], params)[0].token_ids for p in prompts[:2]] == expected[:2]
    assert [r.token_ids for r in graphed.generate(prompts[2:], params)] == expected[2:]
    assert runner.graph_steps >= 3 * 9 and runner.graphs.padded_rows > 0
    assert graphed.kv.num_free_blocks == eager.kv.num_free_blocks  # the sink is nobody's block
    assert runner.kv_cache[:, sink].abs().sum() > 0  # padding wrote there


def test_flashinfer_graph_decode_over_the_stand_in_matches_the_eager_logits_in_bf16():
    config = replace(PRESETS["tiny"], num_heads=2, num_kv_heads=1, head_dim=64)  # a head dim flashinfer runs
    model = DecoderModel(config, random_tensors(config, seed=3), torch.bfloat16)
    options = GraphOptions(max_num_seqs=4, max_model_len=64, capture=eager_capture, attention="flashinfer",
                           flashinfer_module=fake_flashinfer)
    graphed = ModelRunner(model, 32, 4, "torch", graphs=options)
    assert graphed.graphs is not None and graphed.graphs.attention.name == "flashinfer"
    eager = ModelRunner(model, 32, 4, "torch")
    tables = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    seq_lens = [9, 6, 13, 2]
    gen = torch.Generator().manual_seed(0)
    for runner in (graphed, eager):  # the same context in both caches
        runner.kv_cache[:, :32].copy_(torch.randn(runner.kv_cache[:, :32].shape, generator=gen.manual_seed(1))
                                      .to(torch.bfloat16))
    for rows in (1, 3, 4):  # buckets 1, 4 (padded) and 4
        ids = torch.randint(0, config.vocab_size, (rows,), generator=gen).tolist()
        positions = [s - 1 for s in seq_lens[:rows]]
        got = graphed.graphs.run(ids, positions, seq_lens[:rows], tables[:rows]).clone()
        meta = AttentionMetadata.build([1] * rows, seq_lens[:rows], tables[:rows], 4, "cpu")
        eager.attention.plan(meta)
        with torch.inference_mode():
            want = model.forward(torch.tensor(ids), torch.tensor(positions), eager.kv_layers, eager.attention,
                                 torch.arange(rows))
        assert got.shape == want.shape
        assert (got - want).abs().max() < 0.02 * want.abs().max()  # bf16 rounding (~0.5% here), not a wrong row


def test_a_capture_that_fails_leaves_the_runner_eager(fp32_model):
    def failing(forward):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    runner = ModelRunner(fp32_model, 16, 16, "torch",
                         graphs=GraphOptions(max_num_seqs=4, max_model_len=64, capture=failing))
    assert runner.graphs is None


def test_the_graph_workspace_holds_flashinfers_split_kv_scratch():
    from kernels.attention.flashinfer_graph import GRAPH_WORKSPACE_MIB, workspace_bytes

    assert workspace_bytes(128, 9, 3, 64) == GRAPH_WORKSPACE_MIB << 20  # small models: the floor
    # 64 query heads of 128 over 8 KV heads at 256 rows (a Qwen3-32B-like shape): 383 tiles of 16 rows,
    # ~200 MB of float partial outputs, past a 128 MiB workspace
    assert workspace_bytes(256, 64, 8, 128) >= 2 * 64 * 383 * 16 * 128 * 4


def test_a_prefill_node_accepts_cuda_graphs_but_captures_nothing():
    from services.decode_node.config import DecodeNodeConfig
    from services.prefill_node.config import PrefillNodeConfig

    assert DecodeNodeConfig(device="cuda", cuda_graphs="on").engine_config().cuda_graphs
    assert not PrefillNodeConfig(device="cuda", cuda_graphs="on").engine_config().cuda_graphs
