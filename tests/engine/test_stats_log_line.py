"""The nodes' periodic 'engine stats' line (services/engine_node/stats_log.py): rates over the interval, KV
usage, written while there is work and silent when idle; and the engine's count of generated tokens."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import structlog

from services.engine.sampling_params import SamplingParams
from services.engine_node.stats_log import StatsSample, log_stats, stats_line
from tests.engine.test_structured_output import _engine


@pytest.fixture(scope="module")
def engine(family_dir):
    return _engine(family_dir("llama3"))


def test_the_engine_counts_generated_tokens(engine):
    before = engine.stats().generated_tokens_total
    results = engine.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert engine.stats().generated_tokens_total - before == sum(len(r.token_ids) for r in results) == 8


def test_a_line_has_rates_over_the_interval_and_none_when_idle(engine):
    idle = engine.stats()
    busy = dataclasses.replace(idle, prompt_tokens_total=idle.prompt_tokens_total + 300,
                               generated_tokens_total=idle.generated_tokens_total + 50,
                               prefix_hit_tokens_total=idle.prefix_hit_tokens_total + 100, requests_running=3,
                               blocks_free=idle.blocks_total // 2, blocks_cached=0)
    line = stats_line(StatsSample(10.0, idle), StatsSample(12.0, busy))
    assert line == {"running": 3, "waiting": 0, "kv_usage_pct": 50.0, "prompt_tokens_per_s": 150.0,
                    "generation_tokens_per_s": 25.0, "prefix_hit_pct": pytest.approx(33.3), "preemptions": 0}
    assert stats_line(StatsSample(10.0, idle), StatsSample(20.0, idle)) is None


async def test_lines_are_logged_while_there_is_work_until_cancelled(engine):
    idle = engine.stats()
    samples = iter([idle, dataclasses.replace(idle, requests_waiting=2), idle, idle])

    async def sample():
        return next(samples)

    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(log_stats(sample, 0.01))
        await asyncio.wait_for(task, 5)  # the fourth sample raises StopIteration: the logger ends
    lines = [line for line in logs if line["event"] == "engine stats"]
    assert [line["waiting"] for line in lines] == [2]
