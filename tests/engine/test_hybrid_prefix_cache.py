"""A hybrid model's prefix cache (``state_checkpoints.py``), served by the mixed engine in float32 from tiny random
checkpoints of each recurrent kind (Qwen3.5's Gated DeltaNet, Granite 4.0-H's Mamba-2, LFM2's short convolutions),
against transformers' greedy tokens: a shared system prompt is served from a checkpoint from the third request on
(saved mid-chunk or at a chunk's end), a prompt again from its own, a checkpoint evicted is recomputed, and a prefill
node's handed-off state after a hit is the state a decode node goes on from. Nothing is left held after any of
them."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.prefill_role import FirstToken, HandoffPlan
from services.engine.sampling_params import SamplingParams
from tests.engine.test_model_families import assert_matches
from tests.engine.tiny_families import greedy_full_forward, load_reference

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SOUP = [(i * 7919) % 49000 + 17 for i in range(300)]


def _tail(seed: int) -> list[int]:
    return [(i * 104729 + seed * 611) % 49000 + 3 for i in range(40)]


def _engine(path, **overrides) -> LLMEngine:
    settings = dict(model_path=str(path), dtype="float32", num_kv_blocks=128, max_num_batched_tokens=64)
    return LLMEngine.from_config(EngineConfig(**(settings | overrides)))


@pytest.fixture(scope="module", params=["qwen3_5", "granite_hybrid", "lfm2"])
def hybrid(request, family_dir):
    path = family_dir(request.param)
    return request.param, path, load_reference(path)


def _all_free(engine: LLMEngine) -> None:
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert engine.state_slots is not None and not engine.state_slots.holders()


# 216: its prompts leave the shared blocks at 208, inside the fourth chunk of 64; 192: at the end of the third
@pytest.mark.parametrize("shared", [216, 192])
def test_a_shared_system_prompt_is_served_from_a_checkpoint(hybrid, shared):
    name, path, reference = hybrid
    engine = _engine(path)
    prompts = [SOUP[:shared] + _tail(seed) for seed in range(3)]
    cached = []
    for i, prompt in enumerate([*prompts, prompts[0]]):
        result = engine.generate([prompt], GREEDY)[0]
        assert_matches(f"{name}/{shared}/{i}", greedy_full_forward(reference, prompt, GREEDY.max_tokens),
                       result.token_ids)
        cached.append(result.cached_tokens)
    boundary, end = shared // 16 * 16, (len(prompts[0]) - 1) // 16 * 16
    # the first saves at its end only; the second finds the shared blocks uncovered and saves where it leaves them;
    # the third starts there; the first again starts from its own end
    assert cached == [0, 0, boundary, end], cached
    assert engine.state_checkpoints.hits_total == 2
    stats = engine.stats()  # what NodeStatus and /metrics report: two hits of four states saved (ends and the parting)
    assert (stats.state_checkpoint_hits_total, stats.state_checkpoint_saves_total) == (2, 4)
    assert stats.state_checkpoints_used == 4 and stats.state_checkpoints_total == engine.state_checkpoints.capacity
    _all_free(engine)


def test_an_evicted_checkpoint_is_recomputed(hybrid):
    name, path, reference = hybrid
    engine = _engine(path, state_checkpoints=1)
    first, second = SOUP[:150], SOUP[150:] + _tail(1)
    cached = [engine.generate([p], GREEDY)[0].cached_tokens for p in (first, second)]
    result = engine.generate([first], GREEDY)[0]  # its blocks are cached, its checkpoint gone
    assert_matches(f"{name}/evicted", greedy_full_forward(reference, first, GREEDY.max_tokens), result.token_ids)
    assert cached == [0, 0] and result.cached_tokens == 0
    assert engine.kv.match_prefix(first).num_blocks == 9  # its KV blocks were there: the state was not
    assert len(engine.state_checkpoints) == 1
    _all_free(engine)


def test_no_checkpoints_no_hits(hybrid):
    name, path, reference = hybrid
    engine = _engine(path, state_checkpoints=0)
    assert engine.state_checkpoints.capacity == 0 and engine.recurrent_states.checkpoints == 0
    results = engine.generate([SOUP[:100], SOUP[:100]], GREEDY)
    assert [r.cached_tokens for r in results] == [0, 0]
    assert engine.kv.match_prefix(SOUP[:100]).num_blocks == 6  # the blocks are cached; no state is
    assert len(engine.state_checkpoints) == 0 and engine.state_checkpoints.saves_total == 0
    stats = engine.stats()
    assert (stats.state_checkpoints_total, stats.state_checkpoint_saves_total, stats.state_checkpoint_hits_total) == (
        0, 0, 0)
    assert_matches(f"{name}/off", greedy_full_forward(reference, SOUP[:100], GREEDY.max_tokens), results[1].token_ids)
    _all_free(engine)


def _handed_off_state(engine: LLMEngine, request_id: str, prompt: list[int]) -> tuple[torch.Tensor, int]:
    """The recurrent state a prefill-only request hands off after its prompt (float32 mode: every byte is a float32),
    and its prompt tokens served from the cache."""
    engine.admit_prefill(request_id, prompt, GREEDY, HandoffPlan())
    while True:
        for item in engine.handoff_progress(engine.step()):
            if isinstance(item, FirstToken):
                assert item.recurrent_state is not None
                cached = engine.held[request_id].num_cached_tokens
                engine.end_prefill(request_id)
                return torch.frombuffer(bytearray(item.recurrent_state), dtype=torch.float32), cached


def test_a_checkpoint_and_a_hit_hold_the_states_a_whole_prefill_computes(hybrid):
    """The greedy tokens of a tiny random model hardly depend on its recurrent state; the states themselves are
    compared here: the checkpoint saved mid-chunk after 208 tokens is the state of those 208 tokens computed from the
    first, and a prefill node's state after a hit restored from it is the state of the whole prompt."""
    _, path, _ = hybrid
    prompts = [SOUP[:216] + _tail(seed) for seed in range(3)]
    cold_engine = _engine(path, state_checkpoints=0)
    cold, _ = _handed_off_state(cold_engine, "cold", prompts[2])
    at_208, _ = _handed_off_state(cold_engine, "cold-208", SOUP[:208])
    engine = _engine(path)
    for i, prompt in enumerate(prompts[:2]):
        _handed_off_state(engine, f"warm-{i}", prompt)
    states, row = engine.recurrent_states, engine.state_checkpoints.lookup(engine.kv.hash_blocks(SOUP[:208])[-1])
    assert row is not None
    saved = torch.cat([t[row].reshape(-1) for t in (*states.conv, *states.ssm)])
    torch.testing.assert_close(saved, at_208, atol=1e-5, rtol=1e-4)
    warm, cached = _handed_off_state(engine, "hit", prompts[2])
    assert cached == 208
    torch.testing.assert_close(warm, cold, atol=1e-5, rtol=1e-4)
    assert warm.abs().max() > 0.1 and saved.abs().max() > 0.1  # states, not zeros
    _all_free(engine)
