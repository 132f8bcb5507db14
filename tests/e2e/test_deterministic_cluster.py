"""A deterministic cluster (issue 28), real processes, bfloat16: each request gets the same tokens sent alone,
among concurrent others, with its prefix cached, and as the in-process mixed engine computes it (another
process, another thread count), greedy and seeded sampling alike; every node reports the mode."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.e2e.conftest import GATEWAY_ARGS, generate, model_nodes, wait_idle
from tests.engine.prompts import SYSTEM, long_text

pytestmark = pytest.mark.slow
NEW_TOKENS = 12
ENGINE_ARGS = ("--dtype", "bfloat16", "--deterministic", "--threads", "1", "--num-kv-blocks", "512",
               "--max-num-batched-tokens", "64")
SAMPLING = [dict(temperature=0.0), dict(temperature=0.9, top_p=0.9, seed=11), dict(temperature=0.7, top_k=20, seed=3)]


@pytest.fixture(scope="module")
def stub():
    spec = ClusterSpec(engine_args=ENGINE_ARGS, gateway_args=(*GATEWAY_ARGS, "--deterministic"))
    with start_cluster(spec, stderr=subprocess.DEVNULL) as running, grpc.insecure_channel(running.address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


@pytest.fixture(scope="module")
def requests(bundled_tokenizer):
    """(token ids, sampling) of prompts from 1 to ~600 tokens, chat and plain, each sampling three ways."""
    tok = bundled_tokenizer
    prompts = [tok.encode("Hello")[:1], tok.encode("The capital of France is"), tok.encode(long_text(7)),
               tok.encode(tok.hf.apply_chat_template([{"role": "system", "content": SYSTEM},
                                                      {"role": "user", "content": "When does the first train leave?"}],
                                                     tokenize=False, add_generation_prompt=True)),
               tok.encode(long_text(2) + " Who made the clocks?")]
    return [(ids, sampling) for ids in prompts for sampling in SAMPLING]


def _run(stub, ids, sampling):
    tokens, _text, last = generate(stub, token_ids=ids, sampling=gateway_pb2.SamplingParams(
        max_tokens=NEW_TOKENS, ignore_eos=True, **sampling))
    return tokens, last.usage.cached_tokens


def test_every_node_reports_the_mode(stub):
    nodes = model_nodes(stub)
    assert nodes and all(node.deterministic and node.healthy for node in nodes)


def test_alone_concurrent_cached_and_in_process_give_the_same_tokens(stub, requests, bundled_weights,
                                                                       bundled_tokenizer):
    from services.engine.model.decoder import DecoderModel

    alone = [_run(stub, ids, sampling) for ids, sampling in requests]
    wait_idle(stub)
    with ThreadPoolExecutor(len(requests)) as pool:  # the same prompts again, all at once: prefixes now cached
        together = list(pool.map(lambda request: _run(stub, *request), requests))
    wait_idle(stub)
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in alone]
    assert any(cached > 0 for _, cached in together)

    w = bundled_weights
    model = DecoderModel(w.config, w.tensors, torch.bfloat16, quantized=w.quantized, int4_max_rows=8,
                         deterministic=True)
    engine = make_engine(model, bundled_tokenizer, deterministic=True, enable_prefix_caching=False,
                         max_num_batched_tokens=1024)
    mixed = [engine.generate([ids], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, **sampling))[0].token_ids
             for ids, sampling in requests]
    assert mixed == [tokens for tokens, _ in alone]
