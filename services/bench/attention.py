"""Milliseconds per layer call of the paged attention backends (write + attend), on the shapes of SmolLM2-135M.

    python -m services.bench.attention [--layers 30] [--dtype bf16 fp32] [--backend torch cpu_native]
        [--impl auto sdpa bag] [--options plain window=512 sinks softcap=50] [--cases decode] [--settle]

Each case plans one step, then times ``forward`` over ``--layers`` distinct layer caches (views into one
``[layers, num_blocks, 2, block_size, Hkv, D]`` tensor, like the model's), so that KV is read cold as in
a real step; the figures are the median and the best of the per-layer means over the repeats. ``--impl``
picks the torch backend's decode implementation. ``--options`` runs every case as layers with those options
(a sliding ``window``, attention ``sinks``, a logit ``softcap``; ``plain``: none), and ``--cases`` keeps the
cases whose name contains one of its words. On a shared machine, ``--settle`` waits (up to a minute) for the
CPUs to go idle before each case.
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
    Case("decode  1 x ctx 4096", [1], [4096]),
    Case("decode  8 x ctx 2048", [1] * 8, [2048] * 8),
]


def layer_options(spec: str) -> dict[str, object]:
    """``forward``'s keywords for ``spec``: ``plain``, ``window=W``, ``sinks`` or ``softcap=C``."""
    name, _, value = spec.partition("=")
    if name == "plain":
        return {}
    if name == "window":
        return {"window": int(value)}
    if name == "sinks":
        return {"sinks": torch.linspace(-2.0, 3.0, NUM_HEADS)}
    if name == "softcap":
        return {"softcap": float(value)}
    raise ValueError(f"unknown layer option {spec!r} (plain, window=W, sinks, softcap=C)")


def _times_ms(fn: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """(median, best) milliseconds per call over ``repeats`` timed runs of ``fn`` (``calls`` calls each)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times), min(times)


def _cpu_idle_fraction(seconds: float) -> float:
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            ticks = [int(n) for n in stat.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(total1 - total0, 1)


def settle(threshold: float = 0.9, timeout_s: float = 60.0) -> None:
    """Wait until the machine's CPUs are mostly idle (Linux only; returns at once elsewhere)."""
    deadline = time.monotonic() + timeout_s
    try:
        while _cpu_idle_fraction(0.5) < threshold and time.monotonic() < deadline:
            pass
    except OSError:
        return


def make_backend(name: str, impl: str) -> AttentionBackend:
    if name == TorchPagedAttention.name:
        return TorchPagedAttention("cpu", decode_impl=impl)  # type: ignore[arg-type]
    return create_backend(name, "cpu")


def bench_case(
    case: Case, dtype: torch.dtype, backend_name: str, impl: str, layers: int, repeats: int,
    options: dict[str, object] | None = None,
) -> tuple[float, float, float]:
    """(median and best ms per layer forward, best ms per plan) for one step shape."""
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
    backend = make_backend(backend_name, impl)
    _, plan_ms = _times_ms(lambda: backend.plan(meta), 1, repeats)

    def step() -> None:
        for layer in range(layers):
            backend.forward(q, k, v, caches[layer], HEAD_DIM**-0.5, **(options or {}))

    return (*_times_ms(step, layers, repeats), plan_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--backend", nargs="+", default=["torch", "cpu_native"])
    parser.add_argument("--impl", nargs="+", default=["auto"], choices=["auto", "sdpa", "bag"])
    parser.add_argument("--options", nargs="+", default=["plain"], help="plain, window=W, sinks, softcap=C")
    parser.add_argument("--cases", nargs="+", default=[], help="keep the cases whose name contains one of these")
    parser.add_argument("--settle", action="store_true", help="wait for idle CPUs before each case")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.layers} layers, Hq={NUM_HEADS} "
        f"Hkv={NUM_KV_HEADS} D={HEAD_DIM} block={BLOCK_SIZE}; ms per layer call (write + attend)"
    )
    variants = [(b, i) for b in args.backend for i in (args.impl if b == TorchPagedAttention.name else ["-"])]
    cases = [c for c in CASES if not args.cases or any(word in c.name for word in args.cases)]
    print(f"{'dtype':5s} {'options':12s} {'backend':10s} {'impl':5s} {'case':36s} {'median':>8s} {'best':>8s} "
          "ms/layer   plan")
    for dtype_name in args.dtype:
        for spec in args.options:
            for case in cases:
                for backend_name, impl in variants:
                    if args.settle:
                        settle()
                    median, best, plan_ms = bench_case(
                        case, DTYPES[dtype_name], backend_name, impl, args.layers, args.repeats, layer_options(spec)
                    )
                    print(
                        f"{dtype_name:5s} {spec:12s} {backend_name:10s} {impl:5s} {case.name:36s} {median:8.3f} "
                        f"{best:8.3f}            {plan_ms:6.3f} ms"
                    )


if __name__ == "__main__":
    main()
