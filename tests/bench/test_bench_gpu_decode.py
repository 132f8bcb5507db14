"""``gpu.decode``: the decode harness times full batches even when the batch's prompts take many
prefill steps (the requests prefilled first decode meanwhile and must not finish before the timed steps
end: on the H200, batch 128 of 1024-token prompts took 16 prefill steps and 8 requests ran out)."""

from __future__ import annotations

import torch

from services.bench.gpu.decode import decode_step_ms, mean_context, prefill_steps
from services.engine.random_llama import PRESETS, random_model


def test_a_batch_prefilled_over_many_steps_is_timed_whole() -> None:
    model = random_model(PRESETS["tiny"], torch.bfloat16, "cpu", seed=1)
    assert prefill_steps(8, 32, 32) == 8  # one prompt per step: the first decodes through 7 more
    for graphs in (False, True):  # eagerly, then through the decode graphs' CPU stand-in
        ms, backend, replayed = decode_step_ms(model, batch=8, prompt_len=32, steps=2, attention=None,
                                               max_batched_tokens=32, graphs=graphs)
        assert ms > 0 and backend and replayed == graphs


def test_the_mean_context_counts_the_tokens_decoded_during_prefill() -> None:
    assert mean_context(batch=128, prompt_len=1024, steps=32, max_batched_tokens=8192) == 1024 + 8 + 3 + 16
    assert mean_context(batch=1, prompt_len=1024, steps=32, max_batched_tokens=8192) == 1024 + 0 + 3 + 16


def test_a_sliding_window_model_is_timed_eagerly_when_graphs_are_asked_for() -> None:
    """The Gemma 3 shapes (``gemma3-12b`` on a GPU): the graphs leave a windowed model eager, and the harness
    says so (``replayed`` False) instead of failing; prompts of 32 cross the tiny preset's window of 16."""
    model = random_model(PRESETS["tiny-gemma3"], torch.bfloat16, "cpu", seed=1)
    assert type(model).__name__ == "GemmaDecoderModel" and model.config.has_windows
    for graphs in (False, True):
        ms, backend, replayed = decode_step_ms(model, batch=4, prompt_len=32, steps=2, attention=None,
                                               max_batched_tokens=64, graphs=graphs)
        assert ms > 0 and backend and not replayed
