"""``make bench-gpu`` / ``python -m services.bench.gpu.suite``: pdserve's GPU path on one CUDA device.

1. attention: FlashInfer vs the pure-torch backend, decode batches 1/32/128 and a 4096-token prefill
   (``services.bench.gpu.attention``);
2. transfer: the KV of a 4096-token prompt from a prefill node to a decode node on the same GPU, CUDA IPC
   vs the gRPC byte stream (``gpu.transfer``);
3. decode: engine steps of the bundled model (random weights of its shape when the GGUF is absent: the
   speed is the same), of a random ~1B Llama and of random Llama-3.1-8B and Qwen3-8B shapes at batch
   1/32/128, each eager and replayed from CUDA graphs, against the memory-bandwidth floor (``gpu.decode``);
4. prefill: one 4096-token prompt of the 8B shapes as a fraction of the bf16 matmul peak measured in the
   same call (``gpu.prefill``);
5. sampling: a step's sampling over a 128k vocabulary at batch 1/32/128 for each sampling mode, on the
   device against on the host (``gpu.sampling``).

Markdown tables on stdout (the engine's log lines go to stderr); ``--json`` writes every figure. Sections
run in that order; ``--sections`` picks some. ``--smoke`` runs every section with tiny sizes and a tiny
random model, on any ``--device`` (a CPU too: the suite runs it so that this harness works when a GPU
session comes; its figures mean
nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from services.bench.gpu.decode import copy_bandwidth, decode_throughput
from services.common.logging import setup_logging
from services.engine.errors import ModelLoadError
from services.engine.random_llama import PRESETS, random_model, write_random_llama_dir

SECTIONS = ("attention", "transfer", "decode", "prefill", "sampling")
DECODE_PRESETS = ("smollm2-135m", "llama-1b", "llama-3.1-8b", "qwen3-8b")
PREFILL_PRESETS = ("llama-3.1-8b", "qwen3-8b")


SMOKE = {"repeats": 2, "tokens": 64, "batches": [1, 2], "prompt_len": 32, "steps": 2, "layers": 1,
         "prefill_tokens": 64}
"""``--smoke`` sizes (they replace the arguments of the same names)."""


def bundled_or_random(workdir: Path) -> tuple[str, bool]:
    """(model path, is it the bundled GGUF): random weights of its shape, written to ``workdir``, else."""
    from services.engine.model_files import bundled_model_path

    try:
        return str(bundled_model_path()), True
    except ModelLoadError:
        return str(write_random_llama_dir(workdir / "smollm2-135m-random", PRESETS["smollm2-135m"])), False


def section_transfer(models: list[tuple[str, str]], tokens: int, repeats: int, device: str) -> dict[str, object]:
    """``models``: (label, model path) pairs; each is moved both ways by a decode node of its own."""
    from services.bench.gpu.transfer import transfer

    figures: dict[str, object] = {}
    for label, model_path in models:
        result = transfer(model_path, tokens, repeats, device)
        gb = result.bytes / 1e9
        print(f"\n{label}: KV of a {result.tokens}-token prompt ({gb * 1e3:.1f} MB, bf16), prefill → decode node "
              f"on {device} (medians of {repeats}; IPC handshake once per peer pair: {result.handshake_ms:.1f} ms)\n")
        print("| path | ms | GB/s |\n| --- | ---: | ---: |")
        print(f"| gRPC byte stream (4 MiB messages) | {result.grpc_ms:.2f} | {gb / result.grpc_ms * 1e3:.2f} |")
        route = "CUDA IPC (device-to-device copies)" if result.ipc_used else f"IPC fell back: {result.fallback}"
        print(f"| {route} | {result.ipc_ms:.2f} | {gb / result.ipc_ms * 1e3:.2f} |")
        print(f"\nIPC speed-up: {result.speedup:.1f}x (target: at least 20x); IPC GB/s target: at least 200",
              flush=True)
        figures[label] = {**dataclasses.asdict(result), "speedup": result.speedup,
                          "ipc_gb_per_s": gb / result.ipc_ms * 1e3}
    return figures


def section_decode(model_path: str, bundled: bool, batches: list[int], prompt_len: int, steps: int,
                   attention: str | None, device: str, presets: tuple[str, ...]) -> dict[str, object]:
    from services.engine.model.decoder import DecoderModel
    from services.engine.weights import load_weights

    bandwidth = copy_bandwidth(device, gib=2.0 if device == "cuda" else 0.0625)
    print(f"\nDecode steps, bf16, prompts of {prompt_len} tokens; memory bandwidth measured as a device copy: "
          f"{bandwidth / 1e12:.2f} TB/s (read + write)\n")
    print("| model | steps | attention | batch | ms/step | tokens/s | floor ms | × floor |\n"
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for name in presets:
        if name == "smollm2-135m" and bundled:
            weights = load_weights(model_path)
            model, label = DecoderModel(weights.config, weights.tensors, torch.bfloat16, device), "SmolLM2-135M"
        else:
            model = random_model(PRESETS[name], torch.bfloat16, device, seed=1)
            label = f"{name} (random weights)"
        for r in decode_throughput(label, model, batches, bandwidth, prompt_len, steps, attention):
            rows.append({**dataclasses.asdict(r), "of_floor": r.of_floor})
            print(f"| {r.model} | {'graphs' if r.graphs else 'eager'} | {r.attention} | {r.batch} | "
                  f"{r.ms_per_step:.2f} | {r.tokens_per_s:,.0f} | {r.floor_ms:.3f} | {r.of_floor:.2f} |", flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"bandwidth_bytes_per_s": bandwidth, "rows": rows}


def section_prefill(tokens: int, repeats: int, device: str, presets: tuple[str, ...]) -> dict[str, object]:
    from services.bench.gpu.prefill import matmul_peak, prefill_fraction

    peak = matmul_peak(device, size=8192 if device == "cuda" else 256, repeats=20 if device == "cuda" else 2)
    print(f"\nPrefill of one {tokens}-token prompt, bf16 (medians of {repeats}); bf16 matmul peak measured here: "
          f"{peak / 1e12:.0f} TFLOP/s\n")
    print("| model | tokens | ms | TFLOP/s | of the matmul peak |\n| --- | ---: | ---: | ---: | ---: |")
    rows = []
    for name in presets:
        model = random_model(PRESETS[name], torch.bfloat16, device, seed=1)
        r = prefill_fraction(f"{name} (random weights)", model, tokens, peak, repeats)
        rows.append({**dataclasses.asdict(r), "of_peak": r.of_peak})
        print(f"| {r.model} | {r.tokens} | {r.ms:.1f} | {r.flops_per_s / 1e12:.0f} | {r.of_peak:.0%} |", flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"peak_flops_per_s": peak, "rows": rows}


def section_sampling(batches: list[int], repeats: int, device: str, vocab: int) -> dict[str, object]:
    from services.bench.gpu.sampling import sampling_times

    print(f"\nOne step's sampling, {vocab}-token vocabulary (medians of {repeats}): on the device (only the ids "
          f"cross) against on the host (the logits copied first; before issue 29 every row that was not plain "
          f"greedy went this way)\n")
    print("| mode | batch | device ms | host ms | speed-up |\n| --- | ---: | ---: | ---: | ---: |")
    rows = []
    for r in sampling_times(device, batches, repeats, vocab):
        rows.append(dataclasses.asdict(r))
        print(f"| {r.mode} | {r.batch} | {r.device_ms:.2f} | {r.host_ms:.2f} | {r.host_ms / r.device_ms:.1f}x |",
              flush=True)
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--model", default="", help="model for transfer and decode (default: bundled or random)")
    parser.add_argument("--layers", type=int, default=8, help="attention: layer caches per step")
    parser.add_argument("--repeats", type=int, default=10, help="attention repeats (transfer: half)")
    parser.add_argument("--tokens", type=int, default=4096, help="transfer: prompt tokens")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--prompt-len", type=int, default=1024, help="decode: tokens per sequence")
    parser.add_argument("--steps", type=int, default=32, help="decode: timed steps")
    parser.add_argument("--attention", default=None, help="decode: attention backend (default auto)")
    parser.add_argument("--presets", nargs="+", default=list(DECODE_PRESETS), choices=sorted(PRESETS),
                        help="decode: model shapes")
    parser.add_argument("--prefill-presets", nargs="+", default=list(PREFILL_PRESETS), choices=sorted(PRESETS))
    parser.add_argument("--prefill-tokens", type=int, default=4096, help="prefill: prompt tokens")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and model: checks the harness, on any "
                                                             "device; the figures mean nothing")
    args = parser.parse_args()
    setup_logging(fmt="console")  # the engine's log lines on stderr: stdout is the markdown report
    if args.smoke:
        vars(args).update(SMOKE)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu.suite needs a CUDA device (--device cpu --smoke checks the harness on a CPU)")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"# pdserve GPU bench: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"flashinfer {_flashinfer_version() if args.device == 'cuda' else 'not used on a CPU'}")
    figures: dict[str, object] = {"device": name, "torch": torch.__version__, "smoke": args.smoke}
    presets = ("tiny",) if args.smoke else tuple(args.presets)
    with tempfile.TemporaryDirectory() as workdir:
        if args.model:
            model_path, bundled = args.model, True
        elif args.smoke:
            model_path, bundled = str(write_random_llama_dir(Path(workdir) / "tiny", PRESETS["tiny"])), False
        else:
            model_path, bundled = bundled_or_random(Path(workdir))
        figures["model"] = model_path if bundled else f"random weights ({Path(model_path).name})"
        for section in args.sections:
            started = time.perf_counter()
            print(f"\n## {section}", flush=True)
            if section == "attention":
                from services.bench.gpu.attention import run

                figures[section] = run(args.layers, args.repeats, args.device, args.smoke)
            elif section == "transfer":
                models = [("model", model_path)]
                if not args.smoke:  # and the KV layout of the 8B shapes (128 KiB a token)
                    models.append(("llama-3.1-8b KV layout", str(write_random_llama_dir(
                        Path(workdir) / "kv-llama-8b", PRESETS["kv-llama-8b"]))))
                figures[section] = section_transfer(models, args.tokens, max(3, args.repeats // 2), args.device)
            elif section == "decode":
                figures[section] = section_decode(model_path, bundled, args.batches, args.prompt_len, args.steps,
                                                  args.attention, args.device, presets)
            elif section == "sampling":
                figures[section] = section_sampling(args.batches, min(args.repeats, 5), args.device,
                                                    1000 if args.smoke else 128256)
            else:
                figures[section] = section_prefill(args.prefill_tokens, max(3, args.repeats // 2), args.device,
                                                   ("tiny",) if args.smoke else tuple(args.prefill_presets))
            print(f"\n({section}: {time.perf_counter() - started:.0f} s)", flush=True)
            if args.json:
                args.json.write_text(json.dumps(figures, indent=1, default=str))


def _flashinfer_version() -> str:
    from kernels.attention.flashinfer import import_flashinfer
    from kernels.attention.registry import BackendUnavailableError

    try:
        return str(import_flashinfer().__version__)
    except BackendUnavailableError as exc:
        return f"unavailable ({exc})"


if __name__ == "__main__":
    main()
