"""A preempted request whose KV is on its way back from a slow cache-store holds up only itself: on the real
model, a request that arrives meanwhile is admitted around it and finishes, and once the fetch arrives the
victim resumes (no recompute). Both outputs equal an unconstrained run. Before, every admission waited
behind the fetch until it answered or failed (up to the client's 30 s timeout)."""

from __future__ import annotations

import threading
import time

import pytest

from services.engine.admission import AdmissionConfig
from services.engine.request import RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine_node.remote_store import BreakerRemoteStore
from tests.conftest import make_engine
from tests.engine.prompts import STORY

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


class GatedStore:
    """Puts land at once; a get waits until the test opens the gate (a slow or hung cache-store)."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}
        self.gate = threading.Event()
        self.gets_started = threading.Event()

    def put(self, blocks):
        for key, data in blocks:
            self.blocks[key] = bytes(data)

    def get(self, keys, *, restore):
        self.gets_started.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return [self.blocks[key] for key in keys]

    def delete(self, keys):
        return sum(self.blocks.pop(key, None) is not None for key in keys)

    def close(self) -> None:
        self.gate.set()


def test_a_request_arriving_while_a_victims_kv_is_fetched_is_served_around_it(fp32_model, bundled_tokenizer):
    words = STORY.split()
    prompts = [bundled_tokenizer.encode(f"Request {i}: " + " ".join(words[i * 7:i * 7 + 16])) for i in range(2)]
    late = bundled_tokenizer.encode("Once upon a time")
    unconstrained = make_engine(fp32_model, bundled_tokenizer)
    expected = [r.token_ids for r in unconstrained.generate([*prompts, late], [GREEDY, GREEDY, SHORT])]

    # room for both prompts but not both outputs: 6 blocks of 16 tokens, every victim to the cache-store
    assert all(len(p) + GREEDY.max_tokens > 3 * 16 for p in prompts)
    store = GatedStore()
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=6, admission=AdmissionConfig(policy="none"),
                         offload_cache_store="127.0.0.1:1", offload_remote="always",
                         remote_store=lambda address, layout: BreakerRemoteStore(store))  # the fake answers
    try:
        first, victim = (engine.add_request(sampling=GREEDY, token_ids=p, request_id=f"r{i}")
                         for i, p in enumerate(prompts))
        for _ in range(400):
            engine.step()
            if store.gets_started.wait(0.005):  # the fetch runs on the offload's thread
                break
        assert store.gets_started.is_set(), "the victim's fetch never started"
        assert victim.status is RequestStatus.PREEMPTED and first.status.finished

        newcomer = engine.add_request(sampling=SHORT, token_ids=late, request_id="late")
        for _ in range(50):
            engine.step()
            if newcomer.status.finished:
                break
        assert newcomer.status.finished, "the newcomer waited behind the victim's fetch"
        assert victim.status is RequestStatus.PREEMPTED  # still waiting for its KV

        store.gate.set()
        deadline = time.monotonic() + 60
        while engine.has_unfinished() and time.monotonic() < deadline:  # the fetch lands on another thread
            engine.step()
        assert [list(first.output_token_ids), list(victim.output_token_ids), list(newcomer.output_token_ids)] \
            == expected
        assert engine.scheduler.stats.resumes_total == 1 and engine.scheduler.stats.recomputes_total == 0
        engine.offload.wait_io()
        engine.check_integrity()
        assert engine.kv.num_free_blocks == engine.kv.num_blocks, "blocks leaked"
        assert not engine.offload._copies and engine.offload.host_bytes_used == 0, "offloaded KV leaked"
    finally:
        store.gate.set()
        engine.close()
