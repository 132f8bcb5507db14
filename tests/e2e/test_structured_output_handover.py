"""Constrained requests handed over from one decode node to another still give valid output: the adopter
rebuilds the matcher from the spec (``AdoptRequest.sampling``) and the tokens so far. Real processes: a
cache-store, a prefill node, decode nodes A (40 blocks, admission ``none``, preempted KV always to the
cache-store, offered to a peer as soon as it is there) and B (16 blocks), a gateway; the tiny random model
at temperature 1. As in ``test_decode_handover.py``: A has more blocks available, so it leads every
candidate list and takes all six requests; their long answers outgrow its pool, it preempts, and hands
victims to B. Unlike there, the answers end at different lengths (the schema, not ``ignore_eos``), so A
may free room and resume a victim itself: with a 200 ms wait it did so once on CI and nothing was handed
over; with 1 ms the offer goes out on the agent's next poll (50 ms)."""

from __future__ import annotations

import contextlib
import subprocess
import time

import grpc
import pytest
from pdserve.v1 import gateway_pb2_grpc

from services.common.launch import launch
from services.common.ports import unused_port
from tests.e2e.conftest import GATEWAY_ARGS, model_nodes, wait_idle
from tests.e2e.test_structured_output_cluster import FAMILY, LONG_SCHEMA, TINY_ENGINE_ARGS, run_schemas

pytestmark = pytest.mark.slow

MAX_TOKENS = 200  # the answers take ~100; prompt + max_tokens fits the smallest pool (B: 16 blocks of 16)

A_ARGS = ("--num-kv-blocks", "40", "--admission-policy", "none", "--offload-remote", "always",
          "--handover-after-ms", "1")
B_ARGS = ("--num-kv-blocks", "16")


@pytest.fixture(scope="module")
def cluster(family_dir):
    model = ("--model", str(family_dir(FAMILY)))
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str, wait: bool = False, port: int = 0):
            return stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL,
                                              wait=wait, port=port))

        store = start("services.cache_store", wait=True)
        offload = ("--offload-cache-store", store.address)
        # on chosen ports: the gateway starts beside the nodes, given their addresses
        a = start("services.decode_node", *model, *TINY_ENGINE_ARGS, *A_ARGS, *offload, port=unused_port())
        b = start("services.decode_node", *model, *TINY_ENGINE_ARGS, *B_ARGS, *offload, port=unused_port())
        p = start("services.prefill_node", *model, *TINY_ENGINE_ARGS, "--num-kv-blocks", "128", port=unused_port())
        gateway = start("services.gateway", *model, "--prefill", p.address, "--decode", f"{a.address},{b.address}",
                        *GATEWAY_ARGS)
        for process in (a, b, p, gateway):
            process.wait_serving(120)
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            deadline = time.monotonic() + 30
            while len([n for n in model_nodes(stub) if n.healthy]) < 3:
                assert time.monotonic() < deadline, "the gateway never saw all three model nodes healthy"
                time.sleep(0.1)
            yield stub, a.address, b.address


def test_constrained_requests_handed_over_to_another_decode_node_give_valid_json(cluster):
    stub, a, b = cluster
    prompts = [[(i * 53 + j * 13) % 49000 + 5 for j in range(40)] for i in range(6)]  # 3 blocks each on A
    run_schemas(stub, [(LONG_SCHEMA, ids, 200 + i) for i, ids in enumerate(prompts)],
                max_tokens=MAX_TOKENS)
    status = {n.address: n for n in wait_idle(stub, timeout_s=30)}
    assert status[a].preemptions_total >= 1 and status[a].handovers_out_total >= 1, status[a]
    assert status[b].handovers_in_total >= 1, status[b]
    for node in (status[a], status[b]):
        assert node.blocks_free + node.blocks_cached == node.blocks_total
