"""``make bench-determinism``: what the deterministic mode (``--deterministic``, issue 28) costs.

Two engines in this process on the bundled model (bf16, the serving default; ``--threads`` torch threads),
one default and one deterministic, measured in turn (the order flips each round, after a warm-up of each),
medians of ``--repeats`` rounds:

- decode ms/token at concurrency 1 (a 32-token prompt, prefill excluded);
- decode tokens/s at concurrency 16 (16 greedy requests of ``--context`` prompt tokens, in one batch);
- the time to the first token of a 512-token prompt (prefill), and of a 32-token one (a short chunk: where
  a path that pads to a fixed row count would pay).

The goal: the deterministic mode within 10% of the default's throughput. A Markdown table is printed and the
numbers written to ``--json``.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from services.bench.engine import engine_decode_ms, engine_prefill_s
from services.bench.report import write_json
from services.engine.engine import LLMEngine

MODES = ("default", "deterministic")


def _engine(deterministic: bool) -> LLMEngine:
    from services.engine.config import EngineConfig
    from services.engine.model_files import bundled_model_path

    return LLMEngine.from_config(EngineConfig(model_path=str(bundled_model_path()), dtype="bfloat16",
                                              max_num_batched_tokens=1024, enable_prefix_caching=False,
                                              kv_cache_gib=1.0, deterministic=deterministic))


def _measure(engine: LLMEngine, seed: int, args: argparse.Namespace) -> dict[str, float]:
    batch16_ms = engine_decode_ms(engine, 16, args.context, args.steps, seed=seed + 500)
    return {"decode_ms_per_token_c1": engine_decode_ms(engine, 1, 32, args.steps, seed=seed),
            "decode_tokens_per_s_c16": 16 * 1000 / batch16_ms,
            "prefill_512_ms": 1000 * engine_prefill_s(engine, seed + 900),
            "prefill_32_ms": 1000 * engine_prefill_s(engine, seed + 950, 32)}


def measure(args: argparse.Namespace) -> dict[str, dict]:
    engines = {mode: _engine(mode == "deterministic") for mode in MODES}
    for engine in engines.values():  # warm-up: kernels compiled, caches touched
        _measure(engine, 7, argparse.Namespace(**{**vars(args), "steps": 4}))
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for round_ in range(args.repeats):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            runs[mode].append(_measure(engines[mode], 10 * (round_ + 1), args))
    keys = runs["default"][0].keys()
    return {mode: {**{k: statistics.median(r[k] for r in runs[mode]) for k in keys}, "runs": runs[mode]}
            for mode in MODES}


def table(results: dict[str, dict], args: argparse.Namespace) -> str:
    default, fixed = results["default"], results["deterministic"]
    rows = [("Decode ms/token, concurrency 1 (lower is better)", "decode_ms_per_token_c1", False),
            ("Decode tokens/s, concurrency 16", "decode_tokens_per_s_c16", True),
            ("Prefill of 512 tokens, ms (lower is better)", "prefill_512_ms", False),
            ("Prefill of 32 tokens, ms (lower is better)", "prefill_32_ms", False)]
    lines = [f"bundled SmolLM2-135M, bf16, {args.threads} threads; medians of {args.repeats} rounds", "",
             "| | default | deterministic | deterministic throughput / default |", "|---|---|---|---|"]
    for label, key, higher_better in rows:
        ratio = fixed[key] / default[key] if higher_better else default[key] / fixed[key]
        lines.append(f"| {label} | {default[key]:.1f} | {fixed[key]:.1f} | {ratio:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (each mode once per round)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps measured per figure")
    parser.add_argument("--context", type=int, default=256, help="prompt tokens of the concurrency-16 requests")
    parser.add_argument("--json", default="out/bench-determinism.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = measure(args)
    print(table(results, args))
    write_json(args.json, {"args": vars(args), **results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
