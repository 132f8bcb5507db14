"""``make bench-hybrid-prefix``: a hybrid model's prefix cache (state checkpoints), time to the first token of chat
requests that share a system prompt, on a random-weight checkpoint of Qwen3.5-0.8B's shape (bf16, the mixed engine).

Two engines on the same checkpoint in this process: ``--state-checkpoints`` at its default (a quarter of
``max_num_seqs``) and 0 (no prefix reuse for the hybrid model, as before checkpoints). Per repeat, a fresh
``--system-tokens``-token system prompt and three user turns of ``--user-tokens`` tokens each:

- **off**: the third prompt on the engine without checkpoints (the whole prompt computed: the reference);
- **first**: the first prompt on the engine with checkpoints (nothing cached; it saves its state at its end: the
  cost of saving);
- **hit**: the third prompt there, after the second saved where the prompts part (the system prompt's blocks);
- **next turn**: the third prompt, its answer and another user turn (hits the third's checkpoint at its end).

The order of the engines flips every repeat; medians of ``--repeats`` (after ``--warmup``) are printed as a Markdown
table and written to ``--json``. Each row's ``cached`` is the tokens the prefix cache served.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from services.bench.engine import random_prompt
from services.bench.families import write_checkpoint
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.sampling_params import SamplingParams

ROWS = ("off", "first", "hit", "next turn")


def _ttft(engine: LLMEngine, ids: list[int]) -> tuple[float, int, list[int]]:
    """(seconds to the first token, cached tokens, the token) of one request run alone."""
    started = time.perf_counter()
    result = engine.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))[0]
    return time.perf_counter() - started, result.cached_tokens, list(result.token_ids)


def _repeat(engines: dict[str, LLMEngine], seed: int, args: argparse.Namespace) -> dict[str, tuple[float, int]]:
    system = random_prompt(seed, args.system_tokens)
    turns = [system + random_prompt(seed * 10 + i, args.user_tokens) for i in range(3)]
    out: dict[str, tuple[float, int]] = {}
    order = ["off", "on"] if seed % 2 else ["on", "off"]
    for name in order:
        engine = engines[name]
        if name == "off":
            seconds, cached, _ = _ttft(engine, turns[2])
            out["off"] = (seconds, cached)
            continue
        seconds, cached, _ = _ttft(engine, turns[0])
        out["first"] = (seconds, cached)
        _ttft(engine, turns[1])
        seconds, cached, answer = _ttft(engine, turns[2])
        out["hit"] = (seconds, cached)
        following = turns[2] + answer + random_prompt(seed * 10 + 3, args.user_tokens)
        out["next turn"] = _ttft(engine, following)[:2]
    return out


def run(args: argparse.Namespace) -> dict[str, object]:
    from services.engine.model_files import bundled_model_path
    from services.engine.tokenizer import Tokenizer

    tokenizer_hf = Tokenizer.load(bundled_model_path()).hf
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp) / args.shape, args.shape, tokenizer_hf)
        settings = dict(model_path=str(path), dtype="bfloat16", max_num_seqs=8, kv_cache_gib=args.kv_cache_gib,
                        max_num_batched_tokens=args.chunk)
        engines = {"on": LLMEngine.from_config(EngineConfig(**settings)),
                   "off": LLMEngine.from_config(EngineConfig(**settings, state_checkpoints=0))}
        runs: dict[str, list[tuple[float, int]]] = {row: [] for row in ROWS}
        for r in range(args.warmup + args.repeats):
            result = _repeat(engines, 1000 + r, args)
            if r >= args.warmup:
                for row in ROWS:
                    runs[row].append(result[row])
    return {"shape": args.shape, "runs": runs}


def report(result: dict[str, object], args: argparse.Namespace) -> str:
    runs = result["runs"]
    assert isinstance(runs, dict)
    off = statistics.median(s for s, _ in runs["off"])
    lines = [f"{result['shape']}: system prompt {args.system_tokens} tokens, user turns {args.user_tokens}, chunk "
             f"{args.chunk}, threads {args.threads}; medians of {args.repeats}", "",
             "| request | TTFT (s) | cached tokens | vs off |", "| --- | --- | --- | --- |"]
    for row in ROWS:
        seconds = statistics.median(s for s, _ in runs[row])
        cached = statistics.median(c for _, c in runs[row])
        lines.append(f"| {row} | {seconds:.3f} [{min(s for s, _ in runs[row]):.3f}–"
                     f"{max(s for s, _ in runs[row]):.3f}] | {cached:.0f} | {off / seconds:.2f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3.5-0.8b", choices=["qwen3.5-0.8b", "tiny-qwen3.5"])
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--user-tokens", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default="out/bench-hybrid-prefix.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.disable_progress_bar()
    result = run(args)
    print(report(result, args), flush=True)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"args": vars(args), "result": result}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
