"""``python -m services.bench.determinism_kernels``: the deterministic mode's prompt-row kernels beside the
default's, on the bundled model's shapes (bf16, ``--threads`` torch threads), interleaved round by round,
medians of ``--repeats`` rounds:

- attention of one prompt's rows over its own KV (``--prompt`` tokens, 9 query / 3 KV heads of 64): the
  default's ``cpu_native`` (torch's SDPA for prefill) against ``cpu_fixed_order`` (``native/prefill_fixed.c``);
- the four projections of a layer (q/k/v fused, o, gate/up fused, down) at 1, 32, 128 and 512 rows:
  oneDNN in one product (the default), oneDNN in zero-padded 128-row products (the deterministic mode
  without AMX) and ``kernels/amx_linear.py`` (with AMX);
- the same four projections of output rows from the Q4 file's 4-bit codes (random codes, fp16 scales) at 1,
  4, 8, 12, 16 and 32 rows: torch's int4 kernel (the default up to 8 rows; the deterministic mode's before
  ``kernels/int4_fixed.py``), ``kernels/int4_fixed.py`` (the deterministic mode's, where it runs) and oneDNN's
  dense product (the default above 8 rows).

Figures are per 30 layers (the model's depth), in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kernels.amx_linear import amx_linear, amx_supported, pack_amx
from kernels.attention.fixed_order import FixedOrderCpuAttention
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.native_cpu import NativeCpuAttention
from kernels.int4_fixed import int4_fixed_linear, int4_fixed_supported, pack_int4_fixed
from kernels.int4_linear import GroupQuantized, int4_linear, pack_int4
from kernels.linear import _dense, _dense_padded, prepare_linear

LAYERS = 30
PROJECTIONS = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def _interleaved(cases: dict[str, Callable[[], object]], repeats: int, calls: int = 5) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for case in cases.values():
        case()
    for round_ in range(repeats):
        for name in list(cases) if round_ % 2 == 0 else list(cases)[::-1]:
            started = time.perf_counter()
            for _ in range(calls):
                cases[name]()
            times[name].append((time.perf_counter() - started) / calls * LAYERS * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def attention(prompt: int, repeats: int) -> dict[str, float]:
    heads, kv_heads, dim, block = 9, 3, 64, 16
    blocks = -(-prompt // block) + 1
    torch.manual_seed(0)
    cache = torch.randn(blocks, 2, block, kv_heads, dim).bfloat16()
    q, k, v = (torch.randn(prompt, h, dim).bfloat16() for h in (heads, kv_heads, kv_heads))
    cases = {}
    for name, backend, prompt_lens in (("default (SDPA)", NativeCpuAttention(), None),
                                       ("deterministic", FixedOrderCpuAttention(), [prompt])):
        backend.plan(AttentionMetadata.build([prompt], [prompt], [list(range(1, blocks))], block, "cpu", prompt_lens))
        cases[name] = lambda backend=backend: backend.forward(q, k, v, cache, dim**-0.5)
    return _interleaved(cases, repeats)


def projections(rows: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    weights = {name: (torch.randn(*shape) * 0.05).bfloat16() for name, shape in PROJECTIONS.items()}
    dense = {name: prepare_linear(w) for name, w in weights.items()}
    inputs = {name: torch.randn(rows, shape[1]).bfloat16() for name, shape in PROJECTIONS.items()}
    cases = {"oneDNN, one product (default)": lambda: [_dense(inputs[n], dense[n]) for n in PROJECTIONS],
             "oneDNN, padded 128-row products": lambda: [_dense_padded(inputs[n], dense[n]) for n in PROJECTIONS]}
    if amx_supported():
        packed = {name: pack_amx(w) for name, w in weights.items()}
        cases["AMX kernel"] = lambda: [amx_linear(inputs[n], packed[n]) for n in PROJECTIONS]
    return _interleaved(cases, repeats)


def output_projections(rows: int, repeats: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)

    def codes(out_features: int, in_features: int) -> GroupQuantized:
        groups = (out_features, in_features // 32)
        return GroupQuantized(torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8,
                                            generator=generator),
                              (torch.rand(groups, generator=generator) * 0.01).half().float(),
                              (-torch.rand(groups, generator=generator) * 0.08).half().float(), 32)

    quantized = {name: codes(*shape) for name, shape in PROJECTIONS.items()}
    torch_int4 = {name: pack_int4(q) for name, q in quantized.items()}
    dense = {name: prepare_linear(q.dequantize().bfloat16()) for name, q in quantized.items()}
    inputs = {name: torch.randn(rows, shape[1]).bfloat16() for name, shape in PROJECTIONS.items()}
    cases = {"torch int4": lambda: [int4_linear(inputs[n], torch_int4[n]) for n in PROJECTIONS]}
    if int4_fixed_supported():
        fixed = {name: pack_int4_fixed(q) for name, q in quantized.items()}
        cases["int4_fixed (deterministic)"] = lambda: [int4_fixed_linear(inputs[n], fixed[n]) for n in PROJECTIONS]
    cases["oneDNN dense"] = lambda: [_dense(inputs[n], dense[n]) for n in PROJECTIONS]
    return _interleaved(cases, repeats)


def _table(title: str, measure: Callable[[int, int], dict[str, float]], counts: tuple[int, ...],
           repeats: int) -> None:
    names = list(measure(1, 1))
    print(f"\n{title}:\n\n| rows | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for rows in counts:
        print(f"| {rows} | " + " | ".join(f"{v:.1f}" for v in measure(rows, repeats).values()) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--prompt", type=int, default=512)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"ms per {LAYERS} layers, medians of {args.repeats} interleaved rounds, {args.threads} threads\n")
    print(f"Attention of a {args.prompt}-token prompt:", *(f"{k} {v:.1f}" for k, v in
                                                          attention(args.prompt, args.repeats).items()), sep="\n  ")
    _table("The four projections of a layer, prompt rows (dense)", projections, (1, 32, 128, 512), args.repeats)
    _table("The four projections of a layer, output rows (4-bit codes)", output_projections, (1, 4, 8, 12, 16, 32),
           args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
