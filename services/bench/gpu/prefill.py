"""Prefill of one long prompt as a fraction of the GPU's bf16 matrix peak (see ``gpu.suite``).

A prefill step of ``T`` tokens does ``2 * P * T`` FLOPs in the projections (``P``: the weights every token
multiplies, the LM head once for the last token only) and ``2 * layers * q_size * T**2`` in causal
attention (QK^T and PV over half the square); the peak is measured in the same call, as a large bf16
``matmul`` (what the tensor cores sustain, below the datasheet's figure). The timed step is the engine's
whole step: scheduling, metadata, the model, the first token's sampling.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from services.bench.gpu.decode import sync
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel
from services.engine.random_llama import layer_weights
from services.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class PrefillResult:
    model: str
    tokens: int
    ms: float
    flops: float
    peak_flops_per_s: float

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.ms * 1e3

    @property
    def of_peak(self) -> float:
        return self.flops_per_s / self.peak_flops_per_s


def prefill_flops(config: ModelConfig, tokens: int) -> float:
    weights = sum(layer_weights(config, layer) for layer in range(config.num_layers))
    projections = 2 * weights * tokens + 2 * config.vocab_size * config.hidden_size
    attention = 2 * config.num_layers * config.q_size * tokens**2
    return float(projections + attention)


def matmul_peak(device: str = "cuda", size: int = 8192, repeats: int = 20) -> float:
    """FLOP/s of a ``size``-cubed bf16 matmul (the median of ``repeats``)."""
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    times = []
    for _ in range(repeats + 2):
        sync(device)
        started = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times[2:])


def prefill_ms(model: DecoderModel, tokens: int, repeats: int = 5, seed: int = 0) -> float:
    """Median ms of an engine step that prefills one prompt of ``tokens`` random tokens (no prefix cache)."""
    engine = LLMEngine(EngineConfig(model_path="<random>", dtype="bfloat16", device=str(model.device),
                                    num_kv_blocks=-(-tokens // 16) + 16, max_num_seqs=1,
                                    max_num_batched_tokens=tokens, max_model_len=tokens + 1,
                                    enable_prefix_caching=False), model, None)
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    times = []
    for i in range(repeats + 1):  # the first one warms up (kernel selection, JIT modules)
        ids = torch.randint(10, model.config.vocab_size - 10, (tokens,), generator=gen).tolist()
        engine.add_request(token_ids=ids, sampling=params, request_id=f"p{i}")
        sync(model.device)
        started = time.perf_counter()
        outputs = engine.step()
        times.append((time.perf_counter() - started) * 1e3)
        assert [o.request_id for o in outputs if o.finished] == [f"p{i}"], "the prefill took more than one step"
    return statistics.median(times[1:])


def prefill_fraction(name: str, model: DecoderModel, tokens: int, peak: float, repeats: int = 5) -> PrefillResult:
    return PrefillResult(name, tokens, prefill_ms(model, tokens, repeats), prefill_flops(model.config, tokens), peak)
