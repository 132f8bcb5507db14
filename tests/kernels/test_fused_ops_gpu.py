"""FlashInfer's fused ops (``kernels/fused_ops.py``) on a real GPU: each against torch at the bundled model's,
Llama-3.1-8B's and a Qwen3-MoE's shapes, bf16 and fp16, 1 to 4096 tokens, the load check taking all three;
the three replayed from a CUDA graph over fixed buffers; a random model on them against its torch path.
Skipped where CUDA is absent (``gpu`` marker) or flashinfer does not import."""

from __future__ import annotations

import pytest
import torch

from kernels.fused_ops import OPS, FusedOps, torch_ops
from kernels.fused_ops_check import TOLERANCE, CheckShapes, choose
from kernels.rope import RotaryEmbedding
from kernels.rope_scaling import RopeScaling

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
MODELS = {  # shapes, (max_position, theta, rope scaling[, rotary dim])
    "smollm2-135m": (CheckShapes(576, (1536,), 9, 3, 64, 1e-5), (8192, 100000.0, None)),
    "llama-3.1-8b": (CheckShapes(4096, (14336,), 32, 8, 128, 1e-5),
                     (131072, 500000.0, RopeScaling("llama3", factor=8.0, original_max_position=8192))),
    "qwen3-moe": (CheckShapes(2048, (6144, 768), 32, 4, 128, 1e-6),
                  (32768, 1000000.0, RopeScaling("yarn", factor=4.0, original_max_position=8192))),
    # Phi-4-mini: 96 of 128 dims rotate, longrope's short factors
    "phi-4-mini": (CheckShapes(3072, (8192,), 24, 8, 128, 1e-5),
                   (4096, 10000.0, RopeScaling("longrope", factor=32.0, original_max_position=4096,
                                               short_factor=tuple(1.0 + i / 16 for i in range(48))), 96)),
}


@pytest.fixture(scope="module")
def flashinfer():
    return pytest.importorskip("flashinfer", reason="flashinfer-python is not installed (the 'gpu' extra)")


def rope_of(name: str) -> RotaryEmbedding:
    shapes, (max_position, theta, scaling, *rotary) = MODELS[name]
    return RotaryEmbedding(shapes.head_dim, max_position, theta, CUDA, scaling, *rotary)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_op_matches_torch_and_the_load_check_takes_all_three(flashinfer, name: str, dtype: torch.dtype):
    for rows in (1, 7, 300, 4096):
        ops, failed = choose(flashinfer, rope_of(name), MODELS[name][0], CUDA, dtype, rows=rows)
        assert failed == {}, (rows, failed)
        assert ops.flashinfer == OPS


def _step(ops: FusedOps, shapes: CheckShapes, buffers: dict[str, torch.Tensor], weight: torch.Tensor):
    """The three ops as the decoder runs them, on this forward's own copies of the buffers."""
    heads, kv_heads, dim = shapes.num_heads, shapes.num_kv_heads, shapes.head_dim
    rows = buffers["positions"].shape[0]
    x, residual = ops.add_rms_norm(buffers["delta"].clone(), buffers["residual"].clone(), weight, shapes.eps)
    act = ops.silu_and_mul(buffers["gate_up"] * 1)
    q, k, _ = (buffers["qkv"] * 1).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = ops.rope(q.view(rows, heads, dim), k.view(rows, kv_heads, dim), ops.rope.prepare(buffers["positions"]))
    return x, residual, act, q, k


def test_the_ops_replay_from_a_cuda_graph(flashinfer):
    shapes, rope = MODELS["llama-3.1-8b"][0], rope_of("llama-3.1-8b")
    ops, failed = choose(flashinfer, rope, shapes, CUDA, torch.bfloat16)
    assert failed == {}
    gen = torch.Generator(device=CUDA).manual_seed(0)
    rows, width = 16, shapes.intermediates[0]
    sizes = {"delta": shapes.hidden, "residual": shapes.hidden, "gate_up": 2 * width,
             "qkv": (shapes.num_heads + 2 * shapes.num_kv_heads) * shapes.head_dim}
    buffers = {name: torch.zeros(rows, size, device=CUDA, dtype=torch.bfloat16) for name, size in sizes.items()}
    buffers["positions"] = torch.zeros(rows, dtype=torch.long, device=CUDA)
    weight = (1 + torch.randn(shapes.hidden, generator=gen, device=CUDA) / 4).bfloat16()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _step(ops, shapes, buffers, weight)  # outside the graph: lazy loads
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = _step(ops, shapes, buffers, weight)
    reference = torch_ops(rope, torch.bfloat16)
    for _ in range(3):
        for name in sizes:
            buffers[name].copy_(torch.rand(buffers[name].shape, generator=gen, device=CUDA) * 2 - 1)
        buffers["positions"].copy_(torch.randint(0, rope.max_position, (rows,), generator=gen, device=CUDA))
        graph.replay()
        for got, want in zip(outputs, _step(reference, shapes, buffers, weight), strict=True):
            torch.testing.assert_close(got.float(), want.float(), rtol=TOLERANCE, atol=TOLERANCE)


def test_a_random_model_on_the_fused_ops_gives_its_torch_paths_logits(flashinfer):
    from kernels.attention.metadata import AttentionMetadata
    from kernels.attention.registry import create_backend
    from services.engine.random_llama import PRESETS, random_model

    config = PRESETS["smollm2-135m"]
    fused, plain = (random_model(config, torch.bfloat16, "cuda", seed=7, fused_ops=on) for on in (True, False))
    assert fused.ops.flashinfer == OPS and plain.ops.flashinfer == ()
    n, block = 300, 16
    ids = torch.randint(10, config.vocab_size, (n,), generator=torch.Generator().manual_seed(1)).cuda()
    tables = [list(range(-(-n // block)))]
    logits = []
    for m in (fused, plain):
        kv = torch.zeros(config.num_layers, len(tables[0]), 2, block, config.num_kv_heads, config.head_dim,
                         dtype=torch.bfloat16, device="cuda")
        attention = create_backend("torch", "cuda")
        attention.plan(AttentionMetadata.build([n], [n], tables, block, "cuda"))
        with torch.inference_mode():
            logits.append(m.forward(ids, torch.arange(n, device="cuda"), list(kv.unbind(0)), attention,
                                    torch.arange(n, device="cuda")))
    got, want = logits
    assert (got - want).abs().max() < 0.05 * want.abs().max()
