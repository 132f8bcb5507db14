"""``python -m services.engine``: load the bundled model in mixed mode and stream a few generations.

Several prompts run together (continuous batching); their text is streamed as it is decoded. Flags and
``PDSERVE_*`` variables choose the model, dtype and prompts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.model_files import bundled_model_path
from services.engine.sampling_params import SamplingParams
from services.engine.tokenizer import ChatMessage

DEMO_QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="*", help="user messages (default: a few demo questions)")
    parser.add_argument("--model", default=env("PDSERVE_MODEL"), help="GGUF file or HF directory")
    parser.add_argument("--dtype", default=env("PDSERVE_DTYPE", "bfloat16"), choices=["bfloat16", "float32"])
    # string defaults go through ``type`` too: a bad variable is a usage error naming the flag
    parser.add_argument("--max-tokens", type=int, default=env("PDSERVE_MAX_TOKENS", "96"))
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=env("PDSERVE_NUM_THREADS", "0"), help="0: torch's default")
    args = parser.parse_args(argv)
    args.threads = args.threads or None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model_path = args.model or str(bundled_model_path())
    started = time.perf_counter()
    engine = LLMEngine.from_config(EngineConfig(model_path=model_path, dtype=args.dtype, num_threads=args.threads))
    out = sys.stdout
    out.write(f"loaded {model_path} ({args.dtype}) in {time.perf_counter() - started:.1f}s; "
              f"{engine.kv.num_blocks} KV blocks of {engine.kv.block_size} tokens\n")
    questions = args.questions or list(DEMO_QUESTIONS)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=0)
    texts: dict[str, str] = {}
    for i, question in enumerate(questions):
        engine.add_request(messages=[ChatMessage("user", question)], sampling=sampling, request_id=f"q{i}")
        texts[f"q{i}"] = ""
    started, tokens = time.perf_counter(), 0
    while engine.has_unfinished():
        for output in engine.step():
            tokens += len(output.new_token_ids)
            texts[output.request_id] += output.new_text
            if output.request_id == "q0" and output.new_text:
                out.write(output.new_text)
                out.flush()
    elapsed = time.perf_counter() - started
    out.write("\n\n")
    for i, question in enumerate(questions):
        out.write(f"### {question}\n{texts[f'q{i}'].strip()}\n\n")
    out.write(f"{len(questions)} requests, {tokens} tokens in {elapsed:.2f}s ({tokens / elapsed:.1f} tokens/s)\n")
    engine.check_integrity()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
