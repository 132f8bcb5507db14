"""FlashInfer vs the pure-torch backend on one CUDA device: ms per layer call (append + attend), bf16.

    python -m services.bench.gpu.attention [--layers 8] [--repeats 10] [--warmup-only]

Shapes of the bundled SmolLM2-135M (9 query heads, 3 KV heads, head dim 64) and of a Llama-3.2-1B-like
model (32, 8, 64); paged blocks of 16 on randomly permuted pages. Cases: decode batches of 1, 32 and 128
sequences of 1024 tokens, a 4096-token prefill from scratch and one after a 4096-token cached prefix.
Each case plans one step, then times ``forward`` over ``--layers`` layer caches with CUDA events (the
median over repeats, per layer), and the whole step with its plan. FlashInfer's first call compiles its
kernels (JIT, cached under ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``): that time is reported
once. ``--warmup-only`` just compiles, the GPU tests' kernels too (they then find them built).
``run(..., device="cpu", smoke=True)`` runs the same harness on a CPU with tiny cases and the CPU's
``auto`` backend in FlashInfer's place (``gpu.suite --smoke``; the figures mean nothing there).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.attention.base import AttentionBackend
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import create_backend
from kernels.attention.torch_paged import TorchPagedAttention

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Shape:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Case:
    name: str
    query_lens: list[int]
    seq_lens: list[int]


SHAPES = [Shape("smollm2-135m", 9, 3, 64), Shape("llama-1b", 32, 8, 64)]
CASES = [
    Case("decode   1 x 1024", [1], [1024]),
    Case("decode  32 x 1024", [1] * 32, [1024] * 32),
    Case("decode 128 x 1024", [1] * 128, [1024] * 128),
    Case("prefill 4096", [4096], [4096]),
    Case("prefill 4096 after 4096", [4096], [8192]),
]
SMOKE_SHAPES = [Shape("tiny", 4, 2, 64)]
SMOKE_CASES = [Case("decode 2 x 40", [1, 1], [40, 40]), Case("prefill 48 after 16", [48], [64])]


def timed_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` runs (after one warm run): CUDA events on a GPU, the
    wall clock on a CPU."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type != "cuda":
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def make_step(case: Case, shape: Shape, layers: int, device: torch.device, seed: int = 0,
              dtype: torch.dtype = torch.bfloat16):
    """Metadata, q/k/v and ``layers`` caches (one ``[layers, blocks, ...]`` tensor, like the model's pool)."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-s // BLOCK_SIZE) for s in case.seq_lens]
    num_blocks = sum(pages) + 1
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    tables, cursor = [], 0
    for n in pages:
        tables.append(physical[cursor:cursor + n])
        cursor += n
    meta = AttentionMetadata.build(case.query_lens, case.seq_lens, tables, BLOCK_SIZE, device)
    cache = torch.randn(layers, num_blocks, 2, BLOCK_SIZE, shape.num_kv_heads, shape.head_dim, device=device,
                        dtype=dtype)
    tokens = meta.num_tokens
    q = torch.randn(tokens, shape.num_heads, shape.head_dim, device=device, dtype=dtype)
    k = torch.randn(tokens, shape.num_kv_heads, shape.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    return meta, q, k, v, cache


def time_backend(backend: AttentionBackend, case: Case, shape: Shape, layers: int, repeats: int) -> tuple[float, float]:
    """(ms per layer forward with the step planned, ms of a whole step: plan + every layer)."""
    meta, q, k, v, cache = make_step(case, shape, layers, backend.device)
    scale = shape.head_dim**-0.5

    def layers_only() -> None:
        for layer in range(layers):
            backend.forward(q, k, v, cache[layer], scale)

    def whole_step() -> None:
        backend.plan(meta)
        layers_only()

    backend.plan(meta)
    layer_ms = timed_ms(layers_only, repeats, backend.device) / layers
    return layer_ms, timed_ms(whole_step, repeats, backend.device)


TEST_KERNELS = [(torch.float16, Shape("fp16", 9, 3, 64)), (torch.bfloat16, Shape("hd128", 32, 8, 128))]
"""What the GPU tests use beyond the benchmark's bf16 head-dim-64 kernels."""


def warm_up(backend: AttentionBackend, for_tests: bool = False, shapes: list[Shape] = SHAPES) -> float:
    """Seconds of FlashInfer's first calls (its JIT compiles) over every shape's decode and prefill."""
    started = time.perf_counter()
    combos = [(torch.bfloat16, shape) for shape in shapes] + (TEST_KERNELS if for_tests else [])
    for dtype, shape in combos:
        for case in (Case("warm decode", [1, 1], [40, 17]), Case("warm prefill", [30, 1], [50, 9])):
            meta, q, k, v, cache = make_step(case, shape, 1, backend.device, dtype=dtype)
            backend.plan(meta)
            backend.forward(q, k, v, cache[0], shape.head_dim**-0.5)
    if backend.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def run(layers: int, repeats: int, device: str = "cuda", smoke: bool = False,
        prefill_backend: str = "auto") -> list[dict[str, object]]:
    """Every shape x case: FlashInfer's and torch's ms per layer, and the speed-up. Printed and returned.
    On a CPU the candidate is the CPU's ``auto`` backend instead of FlashInfer; ``smoke``: tiny cases.
    ``prefill_backend``: FlashInfer's prefill implementation (``FlashInferBackend``'s argument)."""
    shapes, cases = (SMOKE_SHAPES, SMOKE_CASES) if smoke else (SHAPES, CASES)
    where = torch.device(device)
    if where.type == "cuda":
        from kernels.attention.flashinfer import FlashInferBackend

        candidate: AttentionBackend = FlashInferBackend(where, prefill_backend=prefill_backend)
        name = f"{torch.cuda.get_device_name(where)}, FlashInfer prefill backend {prefill_backend}"
    else:
        candidate, name = create_backend("auto", where), str(where)
    if smoke:
        name += " (smoke run: the figures mean nothing)"
    reference = TorchPagedAttention(where)
    print(f"{candidate.name} first calls (JIT compile or cache load): {warm_up(candidate, shapes=shapes):.1f} s")
    print(f"\n{name}: ms per layer call (append + attend), bf16, {layers} layers, block {BLOCK_SIZE}\n")
    label = candidate.name
    print(f"| model shape | case | {label} ms/layer | torch ms/layer | speed-up | step ms ({label} / torch) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    rows = []
    for shape in shapes:
        for case in cases:
            fi_ms, fi_step = time_backend(candidate, case, shape, layers, repeats)
            torch_ms, torch_step = time_backend(reference, case, shape, layers, repeats)
            rows.append({"shape": shape.name, "case": case.name, "backend": candidate.name, "backend_ms": fi_ms,
                         "torch_ms": torch_ms, "speedup": torch_ms / fi_ms, "step_ms": [fi_step, torch_step]})
            print(f"| {shape.name} | {case.name} | {fi_ms:.4f} | {torch_ms:.4f} | {torch_ms / fi_ms:.1f}x | "
                  f"{fi_step:.2f} / {torch_step:.2f} |", flush=True)
    return rows


def warm_up_fused_ops() -> None:
    """Build (or load) FlashInfer's fused-op modules and check ``grouped_mm`` once, as a model load does, so
    the GPU tests that load models side by side find them built; prints what passed its load check."""
    from kernels.rope import RotaryEmbedding
    from services.engine.model.fused_choice import choose_fused_ops
    from services.engine.model.moe_grouped import grouped_experts_problem
    from services.engine.random_llama import PRESETS

    cfg, device, started = PRESETS["smollm2-135m"], torch.device("cuda"), time.perf_counter()
    rope = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta, device, cfg.rope_scaling)
    ops = choose_fused_ops(cfg, rope, torch.bfloat16, device)
    grouped = grouped_experts_problem(device, torch.bfloat16) or "passes"
    print(f"fused ops warm-up: FlashInfer's {list(ops.flashinfer)} in use, {time.perf_counter() - started:.1f} s; "
          f"grouped experts (bf16): {grouped}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup-only", action="store_true", help="compile FlashInfer's kernels and stop")
    parser.add_argument("--prefill-backend", default="auto", help="FlashInfer's prefill implementation: auto "
                                                                  "(fa3 on Hopper), fa2 or fa3")
    args = parser.parse_args()
    if args.warmup_only:
        from kernels.attention.flashinfer import FlashInferBackend

        print(f"flashinfer warm-up (benchmark and test kernels): {warm_up(FlashInferBackend('cuda'), True):.1f} s")
        warm_up_fused_ops()
        return
    run(args.layers, args.repeats, prefill_backend=args.prefill_backend)


if __name__ == "__main__":
    main()
