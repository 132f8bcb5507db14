"""Batch invariance on the real bundled model in bfloat16 (issue 28): with ``deterministic`` each request's
tokens, greedy or seeded sampling, are the ones it gets alone, whatever else shares its steps, where its
prompt was served from the prefix cache, how it was chunked, whether it was preempted and recomputed, and
whether it ran mixed or prefilled on one engine and decoded on another."""

from __future__ import annotations

import pytest
import torch

from services.engine.admission import AdmissionConfig
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.engine.prompts import STORY, SYSTEM, long_text
from tests.engine.test_disaggregated_handoff import _run_disaggregated

pytestmark = pytest.mark.slow

MAX_TOKENS = 6
QUESTIONS = ["What is the capital of France?", "Name three colours.", "Why is the sky blue?", "Write a haiku.",
             "How many legs has a spider?", "Translate 'good morning' into French.", "What is 17 * 3?",
             "Who wrote Hamlet?", "Give me a train pun.", "Summarise: " + STORY, "Summarise: " + long_text(13)]
PLAIN = ["Hello", "The", "def fib(n):", "1, 2, 3, 4,", "The quick brown fox", "Once upon a time",
         "import torch\n", "Dear Sir or Madam,", "In 1492,", "Paris is", "The recipe needs", "Q: why?\nA:",
         STORY, SYSTEM + "When does the last train leave?", long_text(2), long_text(6), "Roses are red,",
         "SELECT * FROM", "The train to Lyon", "My favourite number is", long_text(14)]


def _chat(text: str) -> str:
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model(bundled_weights):
    from services.engine.model.decoder import DecoderModel

    w = bundled_weights
    return DecoderModel(w.config, w.tensors, torch.bfloat16, quantized=w.quantized, int4_max_rows=8,
                        deterministic=True)


@pytest.fixture(scope="module")
def workload(bundled_tokenizer):
    prompts = [bundled_tokenizer.encode(_chat(q)) for q in QUESTIONS] + [bundled_tokenizer.encode(p) for p in PLAIN]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True) if i % 2 else
              SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.9, top_k=40, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    # 1 to ~1000 tokens (a chat and a plain prompt of ~1000): prompt positions run dense, so they are cheap
    lengths = sorted(map(len, prompts))
    assert len(prompts) >= 30 and lengths[0] == 1 and lengths[-2] > 900 and lengths[-1] < 1100
    return prompts, params


def _engine(model, tokenizer, **overrides):
    return make_engine(model, tokenizer, deterministic=True, **{"num_kv_blocks": 256, **overrides})


@pytest.fixture(scope="module")
def alone(model, bundled_tokenizer, workload):
    """Each request by itself on an engine without a prefix cache, one after the other."""
    engine = _engine(model, bundled_tokenizer, enable_prefix_caching=False, max_num_batched_tokens=2048)
    return [engine.generate([p], s)[0].token_ids for p, s in zip(*workload, strict=True)]


def test_sixteen_concurrent_requests_get_their_tokens_alone(model, bundled_tokenizer, workload, alone):
    engine = _engine(model, bundled_tokenizer, max_num_seqs=16, enable_prefix_caching=False, num_kv_blocks=512)
    assert [r.token_ids for r in engine.generate(*workload)] == alone


def test_prefix_hits_of_several_lengths_and_other_chunks_change_nothing(model, bundled_tokenizer, workload,
                                                                         alone):
    prompts, params = workload
    engine = _engine(model, bundled_tokenizer, max_num_batched_tokens=37)
    warm = SamplingParams(max_tokens=1, temperature=0.0)
    for i, cut in ((0, 16), (1, 33), (2, 48), (len(prompts) - 1, 200), (len(prompts) - 6, 64), (10, 400)):
        engine.generate([prompts[i][:cut]], warm)  # its prefix cached: the rest starts at another offset
    results = engine.generate(prompts, params)
    assert [r.token_ids for r in results] == alone


def test_preempted_and_recomputed_requests_keep_their_tokens(model, bundled_tokenizer, workload, alone):
    prompts, params = workload
    short = [i for i, p in enumerate(prompts) if len(p) < 200]
    engine = make_engine(model, bundled_tokenizer, deterministic=True, num_kv_blocks=12, offload_host_gib=0.0,
                         admission=AdmissionConfig(policy="none"))
    results = engine.generate([prompts[i] for i in short], [params[i] for i in short])
    assert engine.scheduler.stats.recomputes_total > 0
    assert [r.token_ids for r in results] == [alone[i] for i in short]


def test_disaggregated_equals_mixed(model, bundled_tokenizer, workload, alone):
    prompts, params = workload
    chosen = [0, 1, 9, 10, 12, len(prompts) - 3, len(prompts) - 1]
    for sampling in {params[0], params[1]}:
        picked = [i for i in chosen if params[i] == sampling]
        assert picked
        handed = _run_disaggregated(_engine(model, bundled_tokenizer, max_num_batched_tokens=64),
                                    _engine(model, bundled_tokenizer),
                                    {str(i): prompts[i] for i in picked}, sampling)
        assert {int(rid): r.output_token_ids for rid, r in handed.items()} == {i: alone[i] for i in picked}


def test_a_prompt_through_another_requests_output_gets_its_numbers_alone(model, bundled_tokenizer):
    """A multi-turn prompt runs through the first turn's reply: those positions were output positions there
    (4-bit) and are prompt positions here (dense), so the prefix cache serves only the first turn's prompt
    blocks (``prompt_blocks_only``) and the rest is computed as a prompt — the numbers it gets alone."""
    first = bundled_tokenizer.encode(_chat("Summarise: " + STORY))
    engine = _engine(model, bundled_tokenizer)
    reply = engine.generate([first], SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))[0].token_ids
    second = first + reply + bundled_tokenizer.encode("<|im_end|>\n<|im_start|>user\nShorter?<|im_end|>\n")
    probe = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0)
    after = engine.generate([second], probe)[0]
    assert after.cached_tokens == len(first) // 16 * 16, "the first turn's full prompt blocks, no more"
    alone = _engine(model, bundled_tokenizer, enable_prefix_caching=False).generate([second], probe)[0]
    assert [lp.logprob for lp in after.logprobs] == [lp.logprob for lp in alone.logprobs]
