"""``make bench``: decode and prefill speed of the engine on the bundled model, beside transformers.

Each system runs in its own subprocess (so peak resident memory is its own), with the same thread
count. Reported figures are medians over ``--repeats`` runs:

- decode ms/token at batch 1 (a 32-token prompt, 128 new tokens, prefill excluded);
- aggregate decode tokens/s at batch 32 with ~512 tokens of context per sequence (pdserve only), plain and
  with all three penalties on every sequence (repetition 1.1, frequency 0.5, presence 0.5), alternating;
- prefill time (time to first token) for a 512-token prompt;
- peak resident memory of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from services.engine.engine import LLMEngine
from services.engine.sampling_params import SamplingParams

PROMPT_TOKENS = 512


def random_prompt(seed: int, length: int) -> list[int]:
    """``length`` token ids drawn with ``seed`` from [100, 49000): valid in any vocabulary of 49k or more."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(100, 49000, (length,), generator=generator).tolist()


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def engine_decode_ms(engine: LLMEngine, batch: int, context: int, steps: int, seed: int,
                     penalized: bool = False) -> float:
    """ms per engine step decoding ``batch`` greedy requests of ``context``-token prompts (``random_prompt(seed
    * 1000 + i)``), prefill excluded; the requests are then run to completion."""
    penalties = {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5} if penalized \
        else {}
    sampling = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True, **penalties)
    for i in range(batch):
        engine.add_request(sampling=sampling, token_ids=random_prompt(seed * 1000 + i, context))
    while any(r.status.value != "running_decode" for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = time.perf_counter() - started
    while engine.has_unfinished():
        engine.step()
    return elapsed / steps * 1000


def engine_prefill_s(engine: LLMEngine, seed: int, length: int = PROMPT_TOKENS) -> float:
    """Seconds to the first token of one ``length``-token prompt (``random_prompt(seed)``)."""
    engine.add_request(sampling=SamplingParams(max_tokens=1, temperature=0.0),
                       token_ids=random_prompt(seed, length))
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - started


def bench_pdserve(args: argparse.Namespace) -> dict[str, object]:
    from services.engine.config import EngineConfig
    from services.engine.model_files import bundled_model_path

    config = EngineConfig(model_path=str(bundled_model_path()), dtype=args.dtype, max_num_batched_tokens=1024,
                          enable_prefix_caching=False, kv_cache_gib=1.0, int4_max_rows=args.int4_max_rows)
    engine = LLMEngine.from_config(config)

    engine_decode_ms(engine, 1, 32, 8, seed=99)  # warm-up
    engine_prefill_s(engine, 98)
    b1 = [engine_decode_ms(engine, 1, 32, 128, seed=r) for r in range(args.repeats)]
    b32, b32_penalized = [], []
    for r in range(args.repeats):
        b32.append(engine_decode_ms(engine, 32, PROMPT_TOKENS, 16, seed=100 + r))
        b32_penalized.append(engine_decode_ms(engine, 32, PROMPT_TOKENS, 16, seed=100 + r, penalized=True))
    prefill = [engine_prefill_s(engine, 200 + r) for r in range(args.repeats)]
    engine.check_integrity()
    weights = f"4-bit weights up to {engine.model.int4_max_rows} rows" if engine.model.int4_max_rows else "dense"
    return {
        "system": f"pdserve ({args.dtype}, {weights})",
        "decode_ms_per_token_b1": statistics.median(b1),
        "decode_tokens_per_s_b32_ctx512": 32 / (statistics.median(b32) / 1000),
        "decode_tokens_per_s_b32_ctx512_penalties": 32 / (statistics.median(b32_penalized) / 1000),
        "prefill_s_512": statistics.median(prefill),
        "peak_rss_mib": _peak_rss_mib(),
        "runs": {"b1_ms": b1, "b32_step_ms": b32, "b32_penalized_step_ms": b32_penalized, "prefill_s": prefill},
    }


@torch.inference_mode()
def bench_transformers(args: argparse.Namespace) -> dict[str, object]:
    from transformers import AutoModelForCausalLM

    from services.engine.model_files import bundled_model_path

    path = bundled_model_path()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.hf_dtype]
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()

    def run(prompt: list[int], new_tokens: int) -> float:
        ids = torch.tensor([prompt])
        started = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return time.perf_counter() - started

    run(random_prompt(99, 32), 8)
    prefill = [run(random_prompt(200 + r, PROMPT_TOKENS), 1) for r in range(args.repeats)]
    b1 = []
    for r in range(args.repeats):
        prompt = random_prompt(r, 32)
        b1.append((run(prompt, 129) - run(prompt, 1)) / 128 * 1000)
    return {
        "system": f"transformers ({args.hf_dtype})",
        "decode_ms_per_token_b1": statistics.median(b1),
        "decode_tokens_per_s_b32_ctx512": None,
        "decode_tokens_per_s_b32_ctx512_penalties": None,
        "prefill_s_512": statistics.median(prefill),
        "peak_rss_mib": _peak_rss_mib(),
        "runs": {"b1_ms": b1, "prefill_s": prefill},
    }


def _row(result: dict[str, object]) -> str:
    b32, penalized = (result[key] for key in ("decode_tokens_per_s_b32_ctx512",
                                              "decode_tokens_per_s_b32_ctx512_penalties"))
    return (f"| {result['system']} | {result['decode_ms_per_token_b1']:.1f} | "
            f"{'—' if b32 is None else f'{b32:.0f}'} | {'—' if penalized is None else f'{penalized:.0f}'} | "
            f"{result['prefill_s_512']:.3f} | {result['peak_rss_mib']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["pdserve", "transformers"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--hf-dtype", default="float32", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--int4-max-rows", type=int, nargs="+", default=[8, 0],
                        help="pdserve runs, one per value: steps of at most this many tokens use the GGUF's "
                             "4-bit weights (0: dense bf16 only)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--json", default="out/bench-engine.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.only:
        args.int4_max_rows = args.int4_max_rows[0]
        result = bench_pdserve(args) if args.only == "pdserve" else bench_transformers(args)
        print(json.dumps(result))
        return 0
    results = []
    runs = [("pdserve", rows) for rows in args.int4_max_rows]
    runs += [] if args.skip_transformers else [("transformers", 0)]
    for system, rows in runs:
        cmd = [sys.executable, "-m", "services.bench.engine", "--only", system, "--dtype", args.dtype,
               "--hf-dtype", args.hf_dtype, "--repeats", str(args.repeats), "--threads", str(args.threads),
               "--int4-max-rows", str(rows)]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"threads={args.threads}, medians of {args.repeats} runs\n")
    print("| system | decode ms/token, batch 1 | decode tokens/s, batch 32 × 512 ctx | same, with penalties "
          "| prefill 512 tokens (s) | peak RSS (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for result in results:
        print(_row(result))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
