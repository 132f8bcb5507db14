"""``make bench-families``: pdserve's engine beside transformers on random-weight checkpoints of the real shapes
of Qwen3-0.6B, Llama-3.2-1B and Gemma-3-1B (bf16), and on request Gemma-2-2B and GPT-OSS-20B's widths with 2 of
its layers, with the weight-bandwidth floor measured in the same run.

For each shape, transformers builds the checkpoint (``from_config``, fixed seed, ``save_pretrained`` in bf16,
the bundled model's tokenizer beside it) in a temporary directory. pdserve loads it with
``LLMEngine.from_config``; transformers loads it with ``from_pretrained`` and runs a greedy loop over its own
KV cache (the forward pass and an argmax per step, the least a ``generate`` call does). Both run in this
process with the same torch threads and the same token-id prompts, one measurement at a time, alternating
(the order flips every repeat); every figure is the median over ``--repeats`` repeats:

- decode ms/token at batch 1 (``--b1-context``-token prompt, ``--b1-steps`` steps timed, prefill excluded);
- decode tokens/s at batch ``--batch`` (``--batch-context``-token prompts, ``--batch-steps`` steps timed);
- prefill: seconds to the first token of a ``--prefill-tokens``-token prompt.

The floor of a decode step is the bytes it must read (every weight once, the tied LM head included, plus
the KV of its context) over the memory bandwidth: a large bf16 copy between touched buffers, counting the
bytes read and the bytes written (as ``services.bench.gpu.decode`` does on a GPU), measured before
every repeat; the median is used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from services.bench.engine import engine_decode_ms, engine_prefill_s, random_prompt
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.model.config import ModelConfig
from services.engine.random_llama import weight_bytes

SHAPES: dict[str, dict] = {
    "qwen3-0.6b": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True,
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # google/gemma-3-1b-it's shape: 26 layers (sliding window 512 on five of six), 4/1 heads of 256, 262144 ids
    "gemma-3-1b": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                       num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                       max_position_embeddings=32768, query_pre_attn_scalar=256, sliding_window=512,
                       rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    # google/gemma-2-2b's shape: 26 layers (sliding window 4096 on every other one), 8/4 heads of 256, every
    # attention score softcapped at 50, the logits at 30
    "gemma-2-2b": dict(model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                       max_position_embeddings=8192, query_pre_attn_scalar=256, sliding_window=4096,
                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rope_theta=10000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True),
    # openai/gpt-oss-20b's widths and routing (32 experts of 2880, top 4; 64/8 heads of 64; attention sinks; a
    # sliding window of 128 on every other layer) with 2 of its 24 layers, one of each kind: 2.8 B parameters,
    # its experts in bf16 (the published checkpoint's MXFP4, dequantised, as pdserve loads it)
    "gpt-oss-20b-2l": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                           num_hidden_layers=2, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                           num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=131072,
                           rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "truncate": False,
                                            "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
                           rms_norm_eps=1e-5, tie_word_embeddings=False),
    # Qwen/Qwen3.5-0.8B's text model: 24 layers, three Gated DeltaNet layers (16 key and 16 value heads of 128) to
    # one full-attention layer (8/2 heads of 256, rope on a quarter of each, an output gate), 248320 ids
    "qwen3.5-0.8b": dict(model_type="qwen3_5_text", vocab_size=248320, hidden_size=1024, intermediate_size=3584,
                         num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                         linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                         linear_value_head_dim=128, linear_conv_kernel_dim=4, max_position_embeddings=262144,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                          "partial_rotary_factor": 0.25},
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    # state-spaces/mamba2-130m's shape in transformers' form (Mamba-Codestral's kind): 24 layers of one Mamba-2 mixer
    # (24 heads of 64 in one group, a state of 128), no attention, no MLP, no KV; 50288 ids, the head tied
    "mamba2-130m": dict(model_type="mamba2", vocab_size=50288, hidden_size=768, num_hidden_layers=24, num_heads=24,
                        head_dim=64, n_groups=1, state_size=128, expand=2, conv_kernel=4, tie_word_embeddings=True),
    # state-spaces/mamba-130m-hf: 24 layers of one Mamba-1 mixer (an inner width of 1536, a state of 16, step sizes
    # through rank 48); 50280 ids, the head tied
    "mamba-130m": dict(model_type="mamba", vocab_size=50280, hidden_size=768, num_hidden_layers=24, state_size=16,
                       expand=2, conv_kernel=4, time_step_rank=48, tie_word_embeddings=True),
    # the same families, small enough for the test of this benchmark (the bundled tokenizer has 49152 ids)
    "tiny-qwen3": dict(model_type="qwen3", vocab_size=49152, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       max_position_embeddings=1024, rope_theta=1000000.0, tie_word_embeddings=True),
    "tiny-llama": dict(model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, rope_theta=500000.0, tie_word_embeddings=True,
                       rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=256)),
    "tiny-qwen3.5": dict(model_type="qwen3_5_text", vocab_size=49152, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                         linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=1024,
                         tie_word_embeddings=True),
    "tiny-gemma3": dict(model_type="gemma3_text", vocab_size=49152, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                        max_position_embeddings=1024, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True),
}
SYSTEMS = ("pdserve", "transformers")


def write_checkpoint(path: Path, shape: str, tokenizer_hf, seed: int = 0) -> Path:
    """A transformers checkpoint of ``SHAPES[shape]`` with random bf16 weights and ``tokenizer_hf``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES[shape])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(str(path))
    tokenizer_hf.save_pretrained(str(path))
    return path


def memory_bandwidth(mib: int = 512, repeats: int = 4) -> float:
    """Bytes read plus bytes written per second by a bf16 copy of ``mib`` MiB between buffers already written
    (an untouched buffer reads as the kernel's shared zero page, from cache, and overstates it)."""
    src = torch.ones(mib * 2**19, dtype=torch.bfloat16)
    dst = torch.zeros_like(src)
    dst.copy_(src)
    started = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    return 2 * src.numel() * src.element_size() * repeats / (time.perf_counter() - started)


def cpu_stall_us() -> float | None:
    """Microseconds that some task has waited for a CPU since boot (Linux PSI), None where not reported: its
    growth over a run tells how much other work shared the machine."""
    try:
        return float(Path("/proc/pressure/cpu").read_text().split("total=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


class TransformersRunner:
    """The checkpoint in transformers (bf16), driven greedily over its own KV cache."""

    def __init__(self, path: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()

    def _first(self, ids: torch.Tensor):
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return out.cache, out.logits[:, -1].argmax(-1, keepdim=True)

    @torch.inference_mode()
    def decode_ms(self, batch: int, context: int, steps: int, seed: int) -> float:
        """ms per step decoding ``batch`` sequences of the prompts :func:`engine_decode_ms` uses."""
        cache, token = self._first(torch.tensor([random_prompt(seed * 1000 + i, context) for i in range(batch)]))
        started = time.perf_counter()
        for _ in range(steps):
            out = self.model(input_ids=token, cache=cache, use_cache=True)
            cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        return (time.perf_counter() - started) / steps * 1000

    @torch.inference_mode()
    def prefill_s(self, seed: int, length: int) -> float:
        started = time.perf_counter()
        self._first(torch.tensor([random_prompt(seed, length)]))
        return time.perf_counter() - started


def floor_ms(cfg: ModelConfig, bandwidth: float, batch: int, mean_context: float) -> float:
    """The least time a bf16 decode step can take: the weights the batch's tokens use (a sparse layer: the
    experts they pick, expected under uniform routing) and the batch's KV, read once (a sliding-window layer
    reads at most its window of it); a hybrid model's recurrent states, each read and written once."""
    kv_per_layer = cfg.kv_bytes_per_token(2) / max(1, len(cfg.kv_layers))  # (a model without KV: none)
    kv = sum(min(mean_context, cfg.window(i) or mean_context) for i in cfg.kv_layers) * kv_per_layer
    state = 0 if cfg.recurrent is None else 2 * cfg.recurrent.state_bytes(2)
    return (weight_bytes(cfg, 2, batch) + batch * (kv + state)) / bandwidth * 1000


def _engine(path: Path, args: argparse.Namespace) -> LLMEngine:
    longest = max(args.b1_context + args.b1_steps, args.batch_context + args.batch_steps, args.prefill_tokens) + 16
    blocks = args.batch * (-(-(args.batch_context + args.batch_steps + 2) // 16)) + -(-longest // 16) + 8
    return LLMEngine.from_config(EngineConfig(
        model_path=str(path), dtype="bfloat16", num_kv_blocks=blocks, max_num_seqs=max(args.batch, 8),
        max_num_batched_tokens=max(1024, args.prefill_tokens), max_model_len=longest, enable_prefix_caching=False,
        offload_host_gib=0.0, int4_max_rows=0, num_threads=args.threads))


def bench_shape(shape: str, args: argparse.Namespace, tokenizer_hf) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{shape}-") as tmp:
        path = write_checkpoint(Path(tmp), shape, tokenizer_hf, seed=args.seed)
        engine, hf = _engine(path, args), TransformersRunner(path)
    cfg = engine.model.config
    measures: dict[str, dict[str, Callable[[int], float]]] = {
        "pdserve": {
            "b1_ms": lambda s: engine_decode_ms(engine, 1, args.b1_context, args.b1_steps, s),
            "batch_step_ms": lambda s: engine_decode_ms(engine, args.batch, args.batch_context, args.batch_steps, s),
            "prefill_s": lambda s: engine_prefill_s(engine, s, args.prefill_tokens),
        },
        "transformers": {
            "b1_ms": lambda s: hf.decode_ms(1, args.b1_context, args.b1_steps, s),
            "batch_step_ms": lambda s: hf.decode_ms(args.batch, args.batch_context, args.batch_steps, s),
            "prefill_s": lambda s: hf.prefill_s(s, args.prefill_tokens),
        },
    }
    for system in SYSTEMS:  # warm-up: first calls allocate and pick kernels
        engine_decode_ms(engine, 1, 8, 2, 999) if system == "pdserve" else hf.decode_ms(1, 8, 2, 999)
    runs: dict[str, list[float]] = {"bandwidth_gbs": []}
    stall_before, started = cpu_stall_us(), time.perf_counter()
    for r in range(args.repeats):
        runs["bandwidth_gbs"].append(memory_bandwidth(args.bandwidth_mib) / 1e9)
        for key, seed in (("b1_ms", r), ("batch_step_ms", 100 + r), ("prefill_s", 200 + r)):
            for system in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                runs.setdefault(f"{system}.{key}", []).append(measures[system][key](seed))
    stall_after, elapsed = cpu_stall_us(), time.perf_counter() - started
    engine.check_integrity()
    engine.close()
    med = {key: statistics.median(values) for key, values in runs.items()}
    bandwidth = med["bandwidth_gbs"] * 1e9
    return {
        "shape": shape, "params": sum(p.numel() for p in hf.model.parameters()),
        "weight_bytes": weight_bytes(cfg, 2), "medians": med, "runs": runs, "seconds": elapsed,
        "cpu_stall_share": None if stall_before is None or stall_after is None
        else (stall_after - stall_before) / 1e6 / elapsed,
        "floor_b1_ms": floor_ms(cfg, bandwidth, 1, args.b1_context + args.b1_steps / 2),
        "floor_batch_step_ms": floor_ms(cfg, bandwidth, args.batch, args.batch_context + args.batch_steps / 2),
    }


def _cell(runs: list[float], scale: Callable[[float], float], fmt: str) -> str:
    values = sorted(scale(v) for v in runs)
    spread = f" ({values[0]:{fmt}}–{values[-1]:{fmt}})" if len(values) > 1 else ""
    return f"{statistics.median(values):{fmt}}{spread}"


def _share(value: float | None) -> str:
    return "not reported" if value is None else f"{value:.0%}"


def report(result: dict[str, object], args: argparse.Namespace) -> str:
    runs, med = result["runs"], result["medians"]
    per_s = 1000 * args.batch
    lines = [f"### {result['shape']}: {result['params'] / 1e9:.2f} B parameters, "
             f"{result['weight_bytes'] / 1e9:.2f} GB of bf16 weights read per decode step; "
             f"copy bandwidth {_cell(runs['bandwidth_gbs'], float, '.1f')} GB/s (read + written)", "",
             f"CPU stall (PSI) over the {result['seconds']:.0f} s of runs: {_share(result['cpu_stall_share'])} of "
             "the time some task waited for a CPU (near 0% when nothing else runs)", "",
             f"| system | decode ms/token, batch 1 | decode tokens/s, batch {args.batch} × {args.batch_context} ctx "
             f"| prefill {args.prefill_tokens} tokens (s) |", "| --- | --- | --- | --- |"]
    for system in SYSTEMS:
        lines.append(f"| {system} | {_cell(runs[f'{system}.b1_ms'], float, '.1f')} | "
                     f"{_cell(runs[f'{system}.batch_step_ms'], lambda ms: per_s / ms, '.0f')} | "
                     f"{_cell(runs[f'{system}.prefill_s'], float, '.3f')} |")
    lines.append(f"| bandwidth floor | {result['floor_b1_ms']:.1f} | {per_s / result['floor_batch_step_ms']:.0f} | — |")
    pd, hf = (med[f"{system}.b1_ms"] for system in SYSTEMS)
    pd_batch, hf_batch = (med[f"{system}.batch_step_ms"] for system in SYSTEMS)
    pd_prefill, hf_prefill = (med[f"{system}.prefill_s"] for system in SYSTEMS)
    lines += ["", f"pdserve ÷ transformers: batch-1 decode {hf / pd:.2f}× the tokens/s (goal ≥ 3×), batch "
              f"{args.batch} {hf_batch / pd_batch:.2f}×, prefill {hf_prefill / pd_prefill:.2f}× as fast. "
              f"pdserve batch-1 step = {pd / result['floor_b1_ms']:.2f}× the floor (goal ≤ 1.5×), "
              f"transformers {hf / result['floor_b1_ms']:.2f}×; batch {args.batch}: pdserve "
              f"{pd_batch / result['floor_batch_step_ms']:.2f}× the floor.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "llama-3.2-1b", "gemma-3-1b"],
                        choices=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--b1-context", type=int, default=32)
    parser.add_argument("--b1-steps", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batch-context", type=int, default=128)
    parser.add_argument("--batch-steps", type=int, default=16)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--bandwidth-mib", type=int, default=512)
    parser.add_argument("--json", default="out/bench-families.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    from services.engine.model_files import bundled_model_path
    from services.engine.tokenizer import Tokenizer

    logging.disable_progress_bar()
    tokenizer_hf = Tokenizer.load(bundled_model_path()).hf
    print(f"threads={args.threads}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"medians of {args.repeats} repeats (min–max in brackets)\n", flush=True)
    results = []
    for shape in args.shapes:
        results.append(bench_shape(shape, args, tokenizer_hf))
        print(report(results[-1], args), flush=True)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"args": vars(args), "results": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
