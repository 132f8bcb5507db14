"""Decode throughput of the engine on one GPU against the memory-bandwidth floor (see ``gpu.suite``).

A decode step must read every weight once and the KV of every sequence in the batch, so it cannot take
less than ``(weight bytes + KV bytes read) / memory bandwidth``; the bandwidth is measured here as a
device-to-device copy (bytes read + bytes written per second). The measured step includes everything
the engine does per step (scheduling, metadata, attention plan, the model, sampling), run eagerly (one
launch per op) or replayed from the engine's CUDA graphs (``--cuda-graphs on``), each batch both ways in the
same call. On a CPU (``--smoke``) the graphs' stand-in re-runs the forward (``decode_graphs.eager_capture``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from services.engine.config import EngineConfig
from services.engine.decode_graphs import eager_capture
from services.engine.engine import LLMEngine
from services.engine.model.decoder import DecoderModel
from services.engine.random_llama import weight_bytes
from services.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class DecodeResult:
    model: str
    batch: int
    context: int
    attention: str
    ms_per_step: float
    tokens_per_s: float
    floor_ms: float
    bytes_per_step: int
    graphs: bool = False
    """Whether the timed steps replayed CUDA graphs."""

    @property
    def of_floor(self) -> float:
        """How many times the floor one step takes."""
        return self.ms_per_step / self.floor_ms


def copy_bandwidth(device: str = "cuda", gib: float = 2.0, repeats: int = 10) -> float:
    """Bytes per second of a device-to-device copy, counting the bytes read and the bytes written."""
    src = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if src.device.type != "cuda":
        started = time.perf_counter()
        for _ in range(repeats):
            dst.copy_(src)
        return 2 * src.numel() * src.element_size() * repeats / (time.perf_counter() - started)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * src.numel() * src.element_size() * repeats / (start.elapsed_time(end) / 1e3)


def sync(device: str | torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


WARM_STEPS = 3
"""Untimed decode steps once every request has its first token."""
MAX_BATCHED_TOKENS = 8192
"""The engine's token budget per step (chunked prefill of the batch's prompts)."""


def prefill_steps(batch: int, prompt_len: int, max_batched_tokens: int) -> int:
    """Engine steps until every prompt is prefilled (chunked; the requests prefilled first decode meanwhile)."""
    return -(-batch * prompt_len // max_batched_tokens)


def mean_context(batch: int, prompt_len: int, steps: int, max_batched_tokens: int) -> int:
    """Mean tokens per sequence over the timed steps: the requests prefilled first have decoded through the
    later prefill steps (about half of them on average), then the warm-up and half the timed steps."""
    return prompt_len + prefill_steps(batch, prompt_len, max_batched_tokens) // 2 + WARM_STEPS + steps // 2


def decoding_engine(model: DecoderModel, batch: int, prompt_len: int, max_tokens: int, attention: str | None = None,
                    seed: int = 0, max_batched_tokens: int = MAX_BATCHED_TOKENS, graphs: bool = False) -> LLMEngine:
    """An engine of ``model`` (bf16, no prefix caching, a KV pool that fits the batch) holding ``batch``
    greedy requests of ``prompt_len`` random tokens, each generating up to ``max_tokens`` (EOS ignored);
    ``graphs``: decode steps replay CUDA graphs (their stand-in on a CPU)."""
    blocks_per_seq = -(-(prompt_len + max_tokens) // 16)
    on_cuda = model.device.type == "cuda"
    engine = LLMEngine(EngineConfig(model_path="<random>", dtype="bfloat16", device=str(model.device),
                                    num_kv_blocks=batch * blocks_per_seq + 16, max_num_seqs=batch,
                                    max_num_batched_tokens=max_batched_tokens, enable_prefix_caching=False,
                                    max_model_len=prompt_len + max_tokens, attention_backend=attention,
                                    cuda_graphs=graphs and on_cuda), model, None,
                       graph_capture=eager_capture if graphs and not on_cuda else None)
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        ids = torch.randint(10, model.config.vocab_size - 10, (prompt_len,), generator=gen).tolist()
        engine.add_request(token_ids=ids, sampling=params, request_id=f"r{i}")
    return engine


def decode_step_ms(model: DecoderModel, batch: int, prompt_len: int, steps: int, attention: str | None,
                   seed: int = 0, max_batched_tokens: int = MAX_BATCHED_TOKENS, graphs: bool = False
                   ) -> tuple[float, str, bool]:
    """Median ms of one engine step decoding ``batch`` sequences of about ``prompt_len`` tokens, the
    attention backend that ran, and whether every timed step replayed a graph. No request finishes before
    the last timed step: each may generate a token in every prefill step, the warm-up and the timed steps."""
    max_tokens = prefill_steps(batch, prompt_len, max_batched_tokens) + WARM_STEPS + steps + 8
    engine = decoding_engine(model, batch, prompt_len, max_tokens, attention, seed, max_batched_tokens, graphs)
    started: set[str] = set()
    while len(started) < batch:  # prefill (chunked) until every request sampled its first token
        started.update(out.request_id for out in engine.step() if out.new_token_ids)
    for _ in range(WARM_STEPS):
        engine.step()
    times, replayed_before = [], engine.runner.graph_steps
    for _ in range(steps):
        t0 = time.perf_counter()
        outputs = engine.step()  # ends with the sampled tokens on the host: the step is complete
        times.append((time.perf_counter() - t0) * 1e3)
        assert len(outputs) == batch, f"a decode step served {len(outputs)} of {batch} requests"
    replayed = engine.runner.graph_steps - replayed_before == steps
    graphs_attention = engine.runner.graphs.attention.name if engine.runner.graphs is not None else ""
    return statistics.median(times), graphs_attention if replayed else engine.runner.attention.name, replayed


def decode_throughput(name: str, model: DecoderModel, batches: list[int], bandwidth: float, prompt_len: int = 1024,
                      steps: int = 32, attention: str | None = None, graph_modes: tuple[bool, ...] = (False, True)
                      ) -> list[DecodeResult]:
    """Each batch size run once per mode of ``graph_modes`` (eager, then graphs), one after the other."""
    cfg = model.config
    results = []
    for batch in batches:
        for graphs in graph_modes:
            ms, backend, replayed = decode_step_ms(model, batch, prompt_len, steps, attention, graphs=graphs)
            context = mean_context(batch, prompt_len, steps, MAX_BATCHED_TOKENS)
            moved = weight_bytes(cfg, 2, batch) + batch * context * cfg.kv_bytes_per_token(2)
            results.append(DecodeResult(name, batch, context, backend, ms, batch / ms * 1e3,
                                        moved / bandwidth * 1e3, moved, replayed))
            if model.device.type == "cuda":
                torch.cuda.empty_cache()
    return results
