"""Prompt logprobs (vLLM's ``prompt_logprobs``) on the real model (float32): every prompt token after the first
has its logprob and the k most likely tokens at its position, as transformers computes them on the same GGUF;
the same whether the prompt runs in one step or in chunks, alone or beside other requests, and whether or
not its prefix is cached (a request asking for them computes its whole prompt)."""

from __future__ import annotations

import pytest
import torch

from services.engine.admission import AdmissionConfig
from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is Paris, and the capital of Italy is"
ASK = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=3)


@pytest.fixture(scope="module")
def reference(bundled_tokenizer, hf_bundled_model):
    """transformers' log-softmax at every prompt position."""
    ids = bundled_tokenizer.encode(PROMPT)
    with torch.inference_mode():
        logits = hf_bundled_model(input_ids=torch.tensor([ids])).logits[0].float()
    return ids, torch.log_softmax(logits, dim=-1)


def assert_like_reference(entries, reference, k: int = 3) -> None:
    ids, logprobs = reference
    assert [e.token_id for e in entries] == ids[1:]  # one per prompt token after the first
    for position, entry in enumerate(entries):  # the logits at `position` predict token position + 1
        assert entry.logprob == pytest.approx(float(logprobs[position, entry.token_id]), abs=2e-3)
        assert [t for t, _ in entry.top] == logprobs[position].topk(k).indices.tolist()
        assert [v for _, v in entry.top] == pytest.approx(logprobs[position].topk(k).values.tolist(), abs=2e-3)
        row, value = logprobs[position], logprobs[position, entry.token_id]  # its rank, give or take near-ties
        assert int((row > value + 1e-3).sum()) + 1 <= entry.rank <= int((row >= value - 1e-3).sum())


def test_prompt_logprobs_equal_transformers_log_softmax(fp32_model, bundled_tokenizer, reference):
    engine = make_engine(fp32_model, bundled_tokenizer)
    (done,) = engine.generate([PROMPT], ASK)
    assert_like_reference(done.prompt_logprobs, reference)
    assert done.logprobs == []  # new tokens' logprobs are another setting
    engine.check_integrity()


def test_chunked_batched_and_cached_prompts_give_the_same(fp32_model, bundled_tokenizer, reference):
    engine = make_engine(fp32_model, bundled_tokenizer, max_num_batched_tokens=5, block_size=4)
    plain = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    warm, asked, other = engine.generate([PROMPT, PROMPT, "Once upon a time"], [plain, ASK, plain])
    assert warm.prompt_logprobs == [] and other.prompt_logprobs == []
    assert_like_reference(asked.prompt_logprobs, reference)
    (again,) = engine.generate([PROMPT], ASK)  # the prefix cache holds the prompt's blocks now
    assert again.cached_tokens == 0 and again.token_ids == asked.token_ids
    assert_like_reference(again.prompt_logprobs, reference)
    (cached,) = engine.generate([PROMPT], plain)  # a request not asking is served from the cache as before
    assert cached.cached_tokens > 0
    engine.check_integrity()


def test_zero_gives_the_tokens_own_logprobs_and_out_of_range_is_refused(fp32_model, bundled_tokenizer, reference):
    engine = make_engine(fp32_model, bundled_tokenizer)
    (done,) = engine.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    assert_like_reference(done.prompt_logprobs, reference, k=0)
    for bad in (-1, 21):
        with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
            engine.add_request(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=bad))
    engine.check_integrity()


def test_a_request_recomputed_after_a_preemption_does_not_compute_them_again(fp32_model, bundled_tokenizer,
                                                                             reference):
    """Preempted while decoding with no host memory to keep its KV, it recomputes its prompt: its prompt
    logprobs came with its first token, once, and are not computed again."""
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=14, block_size=4, offload_host_gib=0,
                         admission=AdmissionConfig(policy="none"))
    plain = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"Another prompt, number {i}, to fill the pool", plain)
    asked = engine.add_request(PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True,
                                                      prompt_logprobs=1))  # the newest: the one preempted
    shown = []
    while engine.has_unfinished():
        shown += [out.prompt_logprobs for out in engine.step() if out.request_id == asked.request_id
                  and out.prompt_logprobs]
    assert asked.num_preemptions > 0 and engine.stats().recomputes_total > 0
    assert len(shown) == 1
    assert_like_reference(shown[0], reference, k=1)
    assert asked.prompt_logprobs == []  # handed out with the first token, none computed since
    engine.check_integrity()


def test_a_prompt_s_logits_are_computed_a_slice_at_a_time(fp32_model, bundled_tokenizer, reference, monkeypatch):
    """A chunk's prompt rows reach the LM head at most ``PROMPT_LOGPROB_ROWS`` at a time (the sampled rows apart),
    so a long chunk never holds all its ``[rows, vocab]`` logits at once; the logprobs are the same."""
    from services.engine import model_runner

    monkeypatch.setattr(model_runner, "PROMPT_LOGPROB_ROWS", 4)
    sizes: list[int] = []
    head = type(fp32_model).logits
    monkeypatch.setattr(type(fp32_model), "logits", lambda self, rows: sizes.append(rows.shape[0]) or head(self, rows))
    engine = make_engine(fp32_model, bundled_tokenizer)
    (done,) = engine.generate([PROMPT], ASK)
    assert_like_reference(done.prompt_logprobs, reference)
    prompt_rows = len(reference[0]) - 1
    assert max(sizes) == 4 and sum(sizes) == prompt_rows + 2  # the prompt's rows, then each step's sampled row
    engine.check_integrity()
