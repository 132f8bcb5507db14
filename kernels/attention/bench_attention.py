"""Milliseconds per layer call of the torch paged backend (write + attend), on the shapes of SmolLM2-135M.

    python -m kernels.attention.bench_attention [--layers 30] [--dtype bf16 fp32] [--impl auto sdpa bag]

Each case plans one step, then times ``forward`` over ``--layers`` distinct layer caches (views into one
``[layers, num_blocks, 2, block_size, Hkv, D]`` tensor, like the model's), so that KV is read cold as in
a real step; the figure is the best mean over the repeats.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.attention.metadata import AttentionMetadata
from kernels.attention.torch_paged import TorchPagedAttention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Case:
    name: str
    query_lens: list[int]
    seq_lens: list[int]


CASES = [
    Case("decode  1 x ctx 512", [1], [512]),
    Case("decode 32 x ctx 512", [1] * 32, [512] * 32),
    Case("decode 32 x ctx 256..768", [1] * 32, [256 + 16 * i for i in range(32)]),
    Case("prefill 512 from scratch", [512], [512]),
    Case("prefill 512 after 1536 cached", [512], [2048]),
    Case("mixed 31 decode@512 + prefill 128", [1] * 31 + [128], [512] * 31 + [128]),
]


def _best_ms(fn: Callable[[], object], calls: int, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e3


def bench_case(case: Case, dtype: torch.dtype, impl: str, layers: int, repeats: int) -> tuple[float, float]:
    """(ms per layer forward, ms per plan) for one step shape."""
    blocks_per_seq = [-(-s // BLOCK_SIZE) for s in case.seq_lens]
    num_blocks = sum(blocks_per_seq) + 8
    gen = torch.Generator().manual_seed(0)
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    tables, cursor = [], 0
    for n in blocks_per_seq:
        tables.append(physical[cursor : cursor + n])
        cursor += n
    caches = torch.randn(layers, num_blocks, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    meta = AttentionMetadata.build(case.query_lens, case.seq_lens, tables, BLOCK_SIZE, "cpu")
    tokens = meta.num_tokens
    q = torch.randn(tokens, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    backend = TorchPagedAttention("cpu", decode_impl=impl)  # type: ignore[arg-type]
    plan_ms = _best_ms(lambda: backend.plan(meta), 1, repeats)

    def step() -> None:
        for layer in range(layers):
            backend.forward(q, k, v, caches[layer], HEAD_DIM**-0.5)

    return _best_ms(step, layers, repeats), plan_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--impl", nargs="+", default=["auto"], choices=["auto", "sdpa", "bag"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.layers} layers, Hq={NUM_HEADS} "
        f"Hkv={NUM_KV_HEADS} D={HEAD_DIM} block={BLOCK_SIZE}; ms per layer call (write + attend)"
    )
    for dtype_name in args.dtype:
        for impl in args.impl:
            for case in CASES:
                forward_ms, plan_ms = bench_case(case, DTYPES[dtype_name], impl, args.layers, args.repeats)
                print(f"{dtype_name:5s} {impl:5s} {case.name:36s} {forward_ms:8.3f} ms/layer   plan {plan_ms:6.3f} ms")


if __name__ == "__main__":
    main()
