"""The prefill node's cache-store use, below the gRPC layer: fetched blocks enter the local cache as held
prefix hits that the request then uses (same output as computing them), claims never leak, and a failing
store only costs a recompute."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from pdserve.v1 import node_pb2

from kvcache.hashing import hash_token_blocks
from kvcache.kv_bytes import bytes_per_block, read_blocks, write_blocks
from services.engine.prefix_claims import hold_id
from services.engine.sampling_params import SamplingParams
from services.prefill_node.prefix_store import FetchedBlocks, PrefixStore
from tests.conftest import make_engine
from tests.engine.prompts import long_text

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompt(bundled_tokenizer):
    return bundled_tokenizer.encode(long_text(2) + " And then?")


@pytest.fixture(scope="module")
def source(fp32_model, bundled_tokenizer, prompt):
    """An engine that computed the prompt: its output and the KV of its full leading blocks."""
    engine = make_engine(fp32_model, bundled_tokenizer)
    [result] = engine.generate([prompt], GREEDY)
    match = engine.kv.match_prefix(prompt)
    assert match.num_blocks >= 4
    size = bytes_per_block(engine.runner.kv_cache)
    data = read_blocks(engine.runner.kv_cache, match.block_ids)
    return result.token_ids, [data[i * size:(i + 1) * size] for i in range(match.num_blocks)]


def _claim(engine, request_id, prompt, fetched):
    return engine.claim_prefix_blocks(request_id, prompt, fetched.first_block, fetched.end_block)


def _import(engine, request_id, prompt, fetched):
    claim = _claim(engine, request_id, prompt, fetched)
    assert claim is not None
    write_blocks(engine.runner.kv_cache, claim.block_ids, b"".join(fetched.payloads[claim.first_block:]))
    engine.publish_prefix_claim(claim, prompt)
    return claim


def test_imported_blocks_are_prefix_hits_with_the_same_output(fp32_model, bundled_tokenizer, prompt, source):
    want, payloads = source
    engine = make_engine(fp32_model, bundled_tokenizer)
    claim = _import(engine, "r1", prompt, FetchedBlocks(0, payloads))
    assert engine.kv.match_prefix(prompt).num_blocks == len(payloads) == claim.end_block
    engine.check_integrity()

    request = engine.add_request(sampling=GREEDY, token_ids=prompt, request_id="r1")
    while engine.has_unfinished():
        engine.step()
    assert request.output_token_ids == want
    assert request.num_cached_tokens == len(payloads) * engine.kv.block_size

    engine.release_prefix_claim("r1")
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks  # nothing held; the imported blocks stay cached
    assert engine.kv.match_prefix(prompt).num_blocks == len(payloads)


def test_claim_only_takes_what_is_missing_and_never_leaks(fp32_model, bundled_tokenizer, prompt, source):
    _, payloads = source
    engine = make_engine(fp32_model, bundled_tokenizer)
    _import(engine, "a", prompt, FetchedBlocks(0, payloads[:2]))
    engine.release_prefix_claim("a")
    # Blocks 0-1 are local now: a fetch of 0.. claims only 2..; a fetch starting past the local prefix
    # (a gap) or covered by it claims nothing.
    claim = _claim(engine, "b", prompt, FetchedBlocks(0, payloads))
    assert (claim.first_block, claim.end_block) == (2, len(payloads))
    assert len(claim.block_ids) == len(payloads) - 2
    engine.release_prefix_claim("b")  # never written nor published: the blocks go back as plain free blocks
    assert _claim(engine, "c", prompt, FetchedBlocks(3, payloads[3:])) is None
    assert _claim(engine, "d", prompt, FetchedBlocks(0, payloads[:2])) is None
    assert not engine.kv.has_request(hold_id("c")) and not engine.kv.has_request(hold_id("d"))
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert engine.kv.match_prefix(prompt).num_blocks == 2


def test_claim_is_refused_when_the_pool_is_full(fp32_model, bundled_tokenizer, prompt, source):
    _, payloads = source
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=len(payloads) - 1)
    assert _claim(engine, "r", prompt, FetchedBlocks(0, payloads)) is None
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_computed_prompt_blocks_skips_the_cached_ones(fp32_model, bundled_tokenizer, prompt, source):
    _, payloads = source
    engine = make_engine(fp32_model, bundled_tokenizer)
    _import(engine, "r#x", prompt, FetchedBlocks(0, payloads[:2]))
    engine.add_request(sampling=GREEDY, token_ids=prompt, request_id="r", prefill_only=True)
    while engine.has_unfinished():
        engine.step()
    first, data = engine.computed_prompt_blocks("r")
    size = bytes_per_block(engine.runner.kv_cache)
    assert first == 2 and len(data) == (len(prompt) // engine.kv.block_size - 2) * size
    assert data[:size * (len(payloads) - 2)] == b"".join(payloads[2:])  # fp32: the same KV bit for bit
    assert engine.computed_prompt_blocks("unknown") is None


class _Client:
    def __init__(self, stored: int, fail: bool = False, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE):
        self.layout = node_pb2.KVLayout(model_fingerprint=bytes(16), block_size=16, bytes_per_block=4)
        self.stored, self.fail, self.code, self.asked, self.calls = stored, fail, code, [], 0

    async def lookup(self, keys):
        self.calls += 1
        if self.fail:
            raise grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata(), "store down")
        self.asked.append(len(keys))
        return min(self.stored, len(keys))

    async def get(self, keys, allow_partial=False):
        return [b"kvkv"] * len(keys)

    async def close(self):
        pass


def test_fetch_asks_for_the_blocks_after_the_local_prefix_and_survives_a_failing_store():
    prompt = list(range(100, 100 + 16 * 5 + 3))  # 5 full blocks and 3 tokens
    client = _Client(stored=3)
    store = PrefixStore(client)
    hashes = hash_token_blocks(prompt, 16, bytes(16))
    fetched = asyncio.run(store.fetch("r", len(prompt), hashes, local_blocks=1))
    assert client.asked == [4] and (fetched.first_block, len(fetched.payloads)) == (1, 3)
    assert store.stats.fetched_bytes_total == 12
    assert asyncio.run(store.fetch("r", len(prompt), hashes, local_blocks=5)) is None  # everything fetchable is local

    failing = PrefixStore(_Client(stored=5, fail=True))
    assert asyncio.run(failing.fetch("r", len(prompt), hashes, local_blocks=0)) is None
    assert failing.stats.errors_total == 1


def test_a_store_that_timed_out_is_skipped_for_the_breaker_s_cooldown():
    """Every prompt would otherwise wait out the lookup's timeout while the store hangs."""
    from services.cache_store.breaker import StoreBreaker

    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    prompt = list(range(100, 100 + 16 * 5 + 3))
    hashes = hash_token_blocks(prompt, 16, bytes(16))
    client, clock = _Client(stored=3, fail=True, code=grpc.StatusCode.DEADLINE_EXCEEDED), Clock()
    store = PrefixStore(client, breaker=StoreBreaker(cooldown_s=10.0, clock=clock))
    assert asyncio.run(store.fetch("a", len(prompt), hashes, local_blocks=0)) is None
    assert client.calls == 1 and store.breaker.trips_total == 1

    for request_id in "bcd":  # skipped: nothing waits for the hung store, the prompts are computed
        assert asyncio.run(store.fetch(request_id, len(prompt), hashes, local_blocks=0)) is None
    store.write_back("e", hashes, 0, b"kvkv" * 2)
    assert client.calls == 1 and store.stats.writebacks_dropped_total == 1

    clock.now += 10.0  # tried again after the cooldown
    client.fail = False
    fetched = asyncio.run(store.fetch("f", len(prompt), hashes, local_blocks=0))
    assert client.calls == 2 and len(fetched.payloads) == 3

    not_found = PrefixStore(_Client(stored=5, fail=True, code=grpc.StatusCode.NOT_FOUND))
    assert asyncio.run(not_found.fetch("g", len(prompt), hashes, local_blocks=0)) is None
    assert not not_found.breaker.is_open()  # the store answered: not its fault
