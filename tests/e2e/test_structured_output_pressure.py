"""Constrained requests preempted on a small decode pool still give valid output: the decode node rebuilds
each victim's matcher from its spec and its tokens so far, whether its KV was dropped and recomputed
(``--offload-host-gib 0``) or kept in host memory and resumed. One cluster per kind (tiny random model,
temperature 1): eight long JSON answers on 24 blocks of 16 tokens, admission ``none`` so decoding outgrows
the pool."""

from __future__ import annotations

import subprocess

import grpc
import pytest
from pdserve.v1 import gateway_pb2_grpc

from services.cluster.local import start_cluster
from tests.e2e.conftest import wait_idle
from tests.e2e.test_structured_output_cluster import LONG_SCHEMA, SCHEMAS, prompts, run_schemas, tiny_spec

pytestmark = pytest.mark.slow

MAX_TOKENS = 200  # the answers take ~100; prompt + max_tokens fits the smallest pool (B: 16 blocks of 16)

POOL = ("--num-kv-blocks", "24", "--admission-policy", "none")
KINDS = {"recompute": ("--offload-host-gib", "0"), "kept": ("--offload-host-gib", "1")}


@pytest.fixture(scope="module", params=sorted(KINDS))
def pressured(request, family_dir):
    from tests.e2e.test_structured_output_cluster import FAMILY

    spec = tiny_spec(family_dir(FAMILY), decode_args=(*POOL, *KINDS[request.param]))
    with start_cluster(spec, stderr=subprocess.DEVNULL) as running, \
            grpc.insecure_channel(running.address) as channel:
        yield request.param, gateway_pb2_grpc.GatewayStub(channel)


def test_preempted_constrained_requests_give_valid_json(pressured):
    kind, stub = pressured
    cases = [(LONG_SCHEMA if i % 4 else SCHEMAS[i // 4], ids, 100 + i) for i, ids in enumerate(prompts(8))]
    run_schemas(stub, cases, max_tokens=MAX_TOKENS)
    decode = next(n for n in wait_idle(stub, timeout_s=30) if n.role == "decode")
    assert decode.preemptions_total > 0, "the pool was meant to be too small"
    if kind == "recompute":
        assert decode.recomputes_total > 0 and decode.offloads_total == 0, decode
    else:
        assert decode.offloads_total == decode.preemptions_total == decode.resumes_total, decode
        assert decode.recomputes_total == 0, decode
    assert decode.blocks_free + decode.blocks_cached == decode.blocks_total
