"""Preempted requests resume on another decode node, and finished requests' blocks are cached in the
cache-store — with real processes: a cache-store, one prefill node, decode nodes A and B, a gateway.

How the requests land on A first, deterministically: the gateway orders decode candidates by available
blocks (free + cached), then load. A has 40 blocks, B 16, so A leads every candidate list while it has
more than 16 available; the six requests are sent together when both are idle and their prompts take 18
of A's blocks, so A (22+ available) is first for every one of them, with B second — the prefill node
reserves on A and passes B to it as a decode peer.

How A comes under pressure: admission policy ``none`` grants every prompt that fits, and six requests of
~45 prompt + 100 new tokens need ~60 blocks. The newest decoding request is preempted; with
``--offload-remote always`` its KV goes to the cache-store, and after ``--handover-after-ms`` A offers it
to B (``Adopt``), which has room: B fetches the KV, decodes the rest, and the gateway follows the
``moved_to`` at the end of A's stream. Equal max_tokens keep A full until the end, so A cannot resume
the victim itself first.

Last, A is killed mid-stream: the gateway hands each of its streams, as tokens only, to B, which recomputes
their KV and decodes on (``services/gateway/resume.py``) — the client sees the stream go on.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from pdserve.v1 import (
    cache_store_pb2,
    cache_store_pb2_grpc,
    decode_pb2,
    decode_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
)

from services.cache_store.keys import store_key
from services.common.launch import launch
from services.common.ports import unused_port
from services.common.tls.channels import open_sync_channel
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.model_files import bundled_model_path
from services.engine.sampling_params import SamplingParams
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy, model_nodes, wait_idle
from tests.engine.prompts import STORY

pytestmark = pytest.mark.slow

NEW_TOKENS = 100
BLOCK = 16
A_ARGS = ("--num-kv-blocks", "40", "--admission-policy", "none", "--offload-remote", "always",
          "--handover-after-ms", "200", "--cache-outputs")
B_ARGS = ("--num-kv-blocks", "16")


@pytest.fixture(scope="module")
def reference():
    """An in-process engine built as the nodes build theirs (same model fingerprint, so the same keys)."""
    return LLMEngine.from_config(EngineConfig(model_path=str(bundled_model_path()), dtype="float32",
                                              num_kv_blocks=256, max_num_batched_tokens=256))


@pytest.fixture(scope="module")
def prompts(reference):
    words = STORY.split()
    out = [reference.tokenizer.encode(f"Note {i}: " + " ".join(words[i * 5:i * 5 + 32])) for i in range(6)]
    assert all(33 <= len(p) <= 48 for p in out), [len(p) for p in out]  # 3 blocks each on A
    return out


@pytest.fixture(scope="module")
def expected(reference, prompts):
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    return [r.token_ids for r in reference.generate(prompts, params)]


@pytest.fixture(scope="module")
def cluster():
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str, wait: bool = False, port: int = 0):
            return stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL,
                                              wait=wait, port=port))

        store = start("services.cache_store", wait=True)
        offload = ("--offload-cache-store", store.address)
        # on chosen ports: the gateway starts beside the nodes, given their addresses
        a = start("services.decode_node", *ENGINE_ARGS, *A_ARGS, *offload, port=unused_port())
        b = start("services.decode_node", *ENGINE_ARGS, *B_ARGS, *offload, port=unused_port())
        p = start("services.prefill_node", *ENGINE_ARGS, "--cache-store", store.address, port=unused_port())
        gateway = start("services.gateway", "--prefill", p.address, "--decode", f"{a.address},{b.address}",
                        "--cache-store", store.address, *GATEWAY_ARGS)
        for node in (a, b, p, gateway):
            node.wait_serving(120)
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            _wait_healthy(stub)
            yield {"gateway": stub, "a": a.address, "b": b.address, "p": p.address, "store": store.address,
                   "a_process": a}


def _wait_healthy(stub, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len([n for n in model_nodes(stub) if n.healthy]) < 3:
        assert time.monotonic() < deadline, "the gateway never saw all three model nodes healthy"
        time.sleep(0.1)


def _by_address(stub) -> dict[str, gateway_pb2.NodeStatus]:
    return {n.address: n for n in model_nodes(stub)}


def _content_keys(reference, token_ids: list[int]) -> list[bytes]:
    """Keys of the blocks whose KV a finished request computed (all its tokens but the last)."""
    return [store_key(reference.fingerprint, h) for h in reference.kv.hash_blocks(token_ids[:-1])]


def _lookup(store: str, keys: list[bytes], fingerprint: bytes) -> int:
    with open_sync_channel(store, "cache-store") as channel:
        request = cache_store_pb2.LookupRequest(keys=keys, model_fingerprint=fingerprint)
        return cache_store_pb2_grpc.CacheStoreStub(channel).Lookup(request, timeout=10).num_prefix_hits


def test_a_request_preempted_on_one_decode_node_resumes_on_another_with_the_same_output(cluster, prompts,
                                                                                        expected):
    stub = cluster["gateway"]

    def one(ids):
        tokens, first = [], None
        for response in stub.Generate(gateway_pb2.GenerateRequest(token_ids=ids, sampling=greedy(NEW_TOKENS)),
                                      timeout=240):
            first = first or response
            tokens += response.token_ids
            last = response
        return first.decode_node, tokens, last

    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    assert [node for node, _, _ in results] == [cluster["a"]] * len(prompts), "every request starts on A"
    for (_, tokens, last), want in zip(results, expected, strict=True):
        assert tokens == want
        assert last.finish_reason == "length" and last.usage.completion_tokens == NEW_TOKENS

    nodes = wait_idle(stub, timeout_s=30)  # nothing running, reserved or leaked: free + cached == total
    status = _by_address(stub)
    a, b = status[cluster["a"]], status[cluster["b"]]
    assert {n.address for n in nodes} >= {a.address, b.address}
    assert a.preemptions_total >= 1 and a.handovers_out_total >= 1, a
    assert b.handovers_in_total >= 1 and b.store_fetched_bytes_total > 0, b
    assert a.recomputes_total == b.recomputes_total == 0
    assert b.requests_total == 0, "an adopted request counts where it was admitted"
    for node in (a, b):
        assert node.blocks_free + node.blocks_cached == node.blocks_total


def test_finished_requests_blocks_are_in_the_cache_store_only_where_output_caching_is_on(cluster, reference):
    """A has ``--cache-outputs``, B does not. A request through the gateway finishes on A (it has more
    room); one prefilled for B alone (``PrefillNode.Prefill`` with B as the only candidate, then
    ``Attach`` on B) finishes on B. The blocks holding output tokens are in the store for the first one
    only (the prefill node writes prompt blocks back itself, so those are looked up apart). The next turn
    of the first conversation gets them from the store on the prefill node, with the same output."""
    stub = cluster["gateway"]
    wait_idle(stub, timeout_s=30)
    on_a = reference.tokenizer.encode("Output caching on: " + STORY[:200])
    tokens, _, last = generate(stub, token_ids=on_a, sampling=greedy(24))
    assert last.finish_reason == "length"
    keys = _content_keys(reference, on_a + tokens)
    output_keys = keys[len(on_a) // BLOCK:]  # from the block where the output starts
    assert output_keys, "the output fills blocks of its own"
    deadline = time.monotonic() + 10
    while _lookup(cluster["store"], keys, reference.fingerprint) < len(keys):
        assert time.monotonic() < deadline, "the finished request's blocks never reached the cache-store"
        time.sleep(0.05)
    assert _by_address(stub)[cluster["a"]].store_written_blocks_total >= len(keys)

    follow_up = on_a + tokens + reference.tokenizer.encode(" What happened next?")
    before = _by_address(stub)[cluster["p"]].store_hit_tokens_total
    want = reference.generate([follow_up], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    tokens2, _, last = generate(stub, token_ids=follow_up, sampling=greedy(8))
    assert tokens2 == want.token_ids
    assert last.usage.cached_tokens >= len(keys) * BLOCK
    assert _by_address(stub)[cluster["p"]].store_hit_tokens_total - before >= len(output_keys) * BLOCK

    on_b = reference.tokenizer.encode("Output caching off: " + STORY[:200])
    tokens = _run_on(cluster["p"], cluster["b"], "only-b", on_b, 24)
    output_keys = _content_keys(reference, on_b + tokens)[len(on_b) // BLOCK:]
    assert output_keys
    time.sleep(0.5)  # what a background write would need
    assert _lookup(cluster["store"], output_keys, reference.fingerprint) == 0
    assert _by_address(stub)[cluster["b"]].store_written_blocks_total == 0
    wait_idle(stub, timeout_s=30)


def _run_on(prefill: str, decode: str, request_id: str, prompt: list[int], max_tokens: int) -> list[int]:
    """Prefill for one decode node and read its tokens there (the gateway's two legs, by hand)."""
    request = prefill_pb2.PrefillRequest(request_id=request_id, prompt_token_ids=prompt, decode_candidates=[decode],
                                         sampling=greedy(max_tokens))
    with open_sync_channel(prefill, "prefill") as p_channel, \
            open_sync_channel(decode, "decode") as d_channel:
        attach = None
        first = []
        for event in prefill_pb2_grpc.PrefillNodeStub(p_channel).Prefill(request, timeout=60):
            if event.HasField("reserved"):
                assert event.reserved.decode_address == decode
                attach = decode_pb2_grpc.DecodeNodeStub(d_channel).Attach(
                    decode_pb2.AttachRequest(request_id=request_id), timeout=60)
            elif event.HasField("first_token"):
                first = [event.first_token.token_id]
        assert attach is not None and first
        rest = [t for event in attach for t in event.token_ids]
    return first + rest


def test_a_decode_node_killed_mid_stream_its_streams_go_on_recomputed_on_the_other(cluster, reference, prompts):
    """Runs last (it kills A). A greedy and a seeded sampled stream run on A; A is killed once the client
    has 10 tokens of the first. Both complete, with the tokens of an undisturbed run (the seeded sampler
    is keyed by output position), and B counts the two recomputes."""
    stub, tokens = cluster["gateway"], 40
    wait_idle(stub, timeout_s=30)
    seeded = gateway_pb2.SamplingParams(max_tokens=tokens, temperature=0.8, top_k=50, seed=7, ignore_eos=True)
    undisturbed, _, _ = generate(stub, token_ids=prompts[1], sampling=seeded)
    want = reference.generate([prompts[0]], SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    recomputes_before = _by_address(stub)[cluster["b"]].recomputes_total
    wait_idle(stub, timeout_s=30)
    ten_tokens = threading.Event()

    def stream(ids, sampling, signal: bool):
        out, first, last = [], None, None
        for response in stub.Generate(gateway_pb2.GenerateRequest(token_ids=ids, sampling=sampling), timeout=120):
            first, last = first or response, response
            out += response.token_ids
            if signal and len(out) >= 10:
                ten_tokens.set()
        return out, first, last

    with ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(stream, prompts[0], greedy(tokens), True), pool.submit(stream, prompts[1], seeded, False)]
        assert ten_tokens.wait(60), "the greedy stream never got 10 tokens"
        cluster["a_process"].process.kill()
        (greedy_out, greedy_first, greedy_last), (seeded_out, seeded_first, seeded_last) = [c.result() for c in calls]
    assert greedy_first.decode_node == seeded_first.decode_node == cluster["a"], "both started on A"
    assert greedy_out == want[0].token_ids, "the greedy stream goes on exactly"
    assert seeded_out == undisturbed, "so does the seeded one"
    assert greedy_last.finish_reason == seeded_last.finish_reason == "length"
    assert greedy_last.usage.completion_tokens == tokens
    assert _by_address(stub)[cluster["b"]].recomputes_total - recomputes_before == 2, "B recomputed both"
