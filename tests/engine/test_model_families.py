"""Every supported family, as a tiny random-weight checkpoint transformers writes (sharded safetensors,
the bundled tokenizer), served by the mixed engine in float32, gives transformers' greedy tokens (argmax
of a full forward at each step): prompts of 1 to 300 tokens, chunked prefill, a prefix hit, and (for each kind of KV
and attention) requests preempted (KV kept in host memory) and resumed.

Near ties: a divergence is tolerated only from a step where the reference's top-2 margin is below
``NEAR_TIE`` (float32 sums in another order differ by ~1e-6 here); the report prints the smallest margin."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.admission import AdmissionConfig
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.model.decoder import DecoderModel
from services.engine.sampling_params import SamplingParams
from services.engine.weights.model_config_reader import load_model_config
from tests.conftest import make_engine
from tests.engine.hf_reference import first_divergence
from tests.engine.tiny_families import FAMILIES, greedy_full_forward, load_reference

NEAR_TIE = 1e-3
NEW_TOKENS = 8


def _prompts() -> dict[str, list[int]]:
    soup = [(i * 7919) % 49000 + 17 for i in range(300)]
    return {"one-token": [42], "short": soup[100:107], "long": soup,
            "shared-prefix": soup[:256] + [(i * 104729) % 49000 + 3 for i in range(40)]}


def _pressure_prompts() -> list[list[int]]:
    return [[(i * 31 + j * 7) % 49000 + 5 for j in range(24 + 5 * i)] for i in range(6)]


def assert_matches(name: str, expected, actual: list[int]) -> float:
    step = first_divergence(expected.token_ids, actual)
    if step is not None:
        assert step < len(expected.margins) and expected.margins[step] < NEAR_TIE, (
            f"{name}: engine {actual} != transformers {expected.token_ids} from step {step} "
            f"(reference margin {expected.margins[step] if step < len(expected.margins) else None})")
    return min(expected.margins)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, family_dir):
    path = family_dir(request.param)
    reference = load_reference(path)
    prompts = _prompts()
    expected = {name: greedy_full_forward(reference, ids, NEW_TOKENS) for name, ids in prompts.items()}
    return request.param, path, prompts, expected


def _engine(path, **overrides) -> LLMEngine:
    settings = dict(model_path=str(path), dtype="float32", num_kv_blocks=256, max_num_batched_tokens=64)
    return LLMEngine.from_config(EngineConfig(**(settings | overrides)))


def test_mixed_engine_gives_transformers_greedy_tokens(family):
    name, path, prompts, expected = family
    engine = _engine(path)
    assert engine.model.config.architecture == name.split("-")[0].replace("llama3", "llama")
    # the gateway's torch-free reading of the family's config is the engine's (each cluster needs it alike), but
    # for the tying, which the loader decides from the tensors it finds (a stored head that differs stays untied), and
    # the rope tables cut to the pool (a model without rope, Mamba's, has 2**20 positions and 4096 tokens of pool here)
    served = dataclasses.replace(engine.model.config, rope_positions=None)
    assert dataclasses.replace(load_model_config(path), tie_word_embeddings=served.tie_word_embeddings) == served
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    names = list(prompts)
    first = engine.generate([prompts[n] for n in names[:-1]], sampling)  # 300 tokens: prefill in 5 chunks
    hit = engine.generate([prompts[names[-1]]], sampling)[0]  # after "long": its first 256 tokens are cached
    results = [*first, hit]
    margins = [assert_matches(f"{name}/{n}", expected[n], r.token_ids) for n, r in zip(names, results, strict=True)]
    # a hybrid model's recurrent state is not in its KV blocks: a hit needs a state checkpoint, and "long" saved one
    # at its end only (288), so "shared-prefix" computes its 256 tokens again (test_hybrid_prefix_cache.py goes on)
    assert hit.cached_tokens == (0 if engine.model.config.has_recurrent_state else 256), hit.cached_tokens
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    print(f"{name}: smallest reference margin {min(margins):.4f}")


# preempted and resumed: the families whose KV or attention differs (windows, sinks, a softcap, a local rope, latent
# KV, experts, a fused projection, a recurrent state of each kind, a query temperature by position, chunked attention,
# heads per layer in a KV slot and KV shared across layers, an index key in the latent row, no KV at all: blocks of no
# bytes); every other family's
# layer is one of theirs
PREEMPTED = ("llama3", "mistral", "mixtral", "phi3", "gpt_oss", "gemma2", "gemma3", "deepseek-v3", "deepseek_v32",
             "olmo3", "minimax_m2", "qwen3_5", "granite_hybrid", "lfm2", "mistral3", "gemma4-e", "llama4", "mamba")


@pytest.mark.parametrize("name", PREEMPTED)
def test_preempted_and_resumed_requests_keep_transformers_tokens(name, family_dir):
    path = family_dir(name)
    reference = load_reference(path)
    pressure = _pressure_prompts()
    expected = [greedy_full_forward(reference, ids, 24) for ids in pressure]
    engine = _engine(path, num_kv_blocks=12, admission=AdmissionConfig(policy="none"))
    results = engine.generate(pressure, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    for i, (result, reference) in enumerate(zip(results, expected, strict=True)):
        assert_matches(f"{name}/pressure-{i}", reference, result.token_ids)
    stats = engine.scheduler.stats
    # a hybrid model's preempted requests are recomputed (their recurrent state is not kept with their KV)
    resumed = stats.recomputes_total if engine.model.config.has_recurrent_state else stats.resumes_total
    assert stats.preemptions_total > 0 and resumed > 0, stats
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_llama3_rope_scaling_is_what_makes_it_exact(family_dir, bundled_tokenizer):
    """The case that was served silently wrong: the same weights without the llama3 frequencies give other
    tokens, so the parity above depends on the scaling being applied."""
    from services.engine.weights import load_weights

    path = family_dir("llama3")
    weights = load_weights(path)
    assert weights.config.rope_scaling is not None and weights.config.rope_scaling.rope_type == "llama3"
    prompt = _prompts()["long"]
    expected = greedy_full_forward(load_reference(path), prompt, NEW_TOKENS).token_ids
    assert greedy_tokens(weights, weights.config, bundled_tokenizer, prompt) == expected
    unscaled = dataclasses.replace(weights.config, rope_scaling=None)
    assert greedy_tokens(weights, unscaled, bundled_tokenizer, prompt) != expected


def greedy_tokens(weights, config, tokenizer, prompt: list[int]) -> list[int]:
    """The greedy tokens of ``weights`` run as ``config`` (a config with a feature taken away shows that the
    parity depends on it)."""
    model = DecoderModel(config, weights.tensors, weights.tensors["model.embed_tokens.weight"].dtype)
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    return make_engine(model, tokenizer).generate([prompt], sampling)[0].token_ids


def test_mistral_is_served_past_its_sliding_window(family_dir):
    """Mistral-7B-v0.1's window (4096 of 32768) holds on every layer, served exactly: the context is not capped."""
    engine = _engine(family_dir("mistral"))
    assert engine.model.config.layer_windows == (24,) * 3
    assert engine.max_model_len == 4096


def test_generation_config_adds_its_eos_ids(family_dir, tmp_path):
    import json
    import shutil

    path = shutil.copytree(family_dir("qwen3"), tmp_path / "qwen3")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7, 11]}))
    engine = _engine(path)
    assert {2, 7, 11} <= set(engine.eos_token_ids)
