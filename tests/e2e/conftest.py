"""Real clusters of real processes on loopback (gateway, prefill, decode, cache-store), the real model."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, LocalCluster, start_cluster
from services.common.tls.ca import role_dns
from tests.tls_identities import session_root

# float32 so outputs can be compared token for token with the mixed engine; one torch thread per node
# (several model processes share this machine's two cores); a small KV pool.
ENGINE_ARGS = ("--dtype", "float32", "--threads", "1", "--num-kv-blocks", "512", "--max-num-batched-tokens", "256")
GATEWAY_ARGS = ("--poll-interval-s", "0.2", "--status-max-age-s", "0")


# One prefill node, one decode node, a cache-store, the gateway with its HTTP front (``cluster``).
SHARED = ClusterSpec(engine_args=ENGINE_ARGS, gateway_args=GATEWAY_ARGS, http_listen="127.0.0.1:0")


# Two prefill nodes that fetch prompt blocks from the cache-store and write theirs back; load routing, so equally
# loaded prefill nodes rotate (cache-aware routing would keep a prefix on one node).
PREFILL_PAIR = ClusterSpec(num_prefill=2, engine_args=ENGINE_ARGS, gateway_args=(*GATEWAY_ARGS, "--routing", "load"),
                           prefill_cache_store=True)


class SharedCluster:
    """A cluster that the modules needing the same spec share: started for the first of them, stopped after
    the last (``prefill_pair``). Once one of its processes has exited (a test killed it), the next module to
    ask gets a fresh cluster."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self._stack: contextlib.ExitStack | None = None
        self._running: LocalCluster | None = None

    def get(self) -> LocalCluster:
        if self._running is not None and self._running.lost():
            self.close()
        if self._running is None:
            stack = contextlib.ExitStack()
            self._running = stack.enter_context(start_cluster(self.spec, stderr=subprocess.DEVNULL))
            self._stack = stack
        return self._running

    def close(self) -> None:
        stack, self._stack, self._running = self._stack, None, None
        if stack is not None:
            stack.close()

    @classmethod
    def for_session(cls, spec: ClusterSpec) -> Iterator[SharedCluster]:
        """A session fixture's body: the shared cluster of ``spec``, closed at the end of the session."""
        shared = cls(spec)
        try:
            yield shared
        finally:
            shared.close()

    def lend(self, request: pytest.FixtureRequest, fixture: str) -> Iterator[LocalCluster]:
        """A module fixture's body: the running cluster, closed after the module when it lost a process or
        no later module asks for ``fixture``."""
        running = self.get()
        yield running
        if running.lost() or not asked_for_later(request, fixture):
            self.close()


@pytest.fixture(scope="session")
def _shared():
    yield from SharedCluster.for_session(SHARED)


@pytest.fixture(scope="module")
def cluster(request, _shared):
    """SHARED, shared by every module that asks for it (gRPC and OpenAI tests alike), so their tests measure
    deltas and use their own prompts, and leave it idle. Stopped after the last module that asks for it (its
    idle processes would take CPU from the rest of the session), or as soon as it has lost a process."""
    yield from _shared.lend(request, "_shared")


@pytest.fixture(scope="module")
def stub(cluster):
    with grpc.insecure_channel(cluster.address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


@pytest.fixture(scope="session")
def _prefill_pair():
    yield from SharedCluster.for_session(PREFILL_PAIR)


@pytest.fixture(scope="module")
def prefill_pair(request, _prefill_pair):
    """PREFILL_PAIR, shared by the modules that use it (each sends prompts of its own and measures deltas);
    a fresh one for a module that comes after a test killed one of its processes. Stopped after the last
    module that asks for it, or as soon as it has lost a process."""
    yield from _prefill_pair.lend(request, "prefill_pair")


def asked_for_later(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test after the current module's in this session uses ``fixture``."""
    items = request.session.items
    last = max(i for i, item in enumerate(items) if getattr(item, "module", None) is request.module)
    return any(fixture in item.fixturenames for item in items[last + 1:])


def grpcurl_security(role: str, holder: str = "test") -> list[str]:
    """grpcurl's flags to reach a node of ``role`` over mTLS as ``holder`` (a directory of the session CA,
    ``tests/conftest.py``; "test" holds every role, admin included); the gateway's public port (role
    "gateway" here) is plaintext."""
    if role == "gateway":
        return ["-plaintext"]
    held = session_root() / holder
    return ["-cacert", str(held / "ca.crt"), "-cert", str(held / "tls.crt"), "-key", str(held / "tls.key"),
            "-servername", role_dns(role)]


def generate(stub, timeout: float = 120.0, **fields) -> tuple[list[int], str, gateway_pb2.GenerateResponse]:
    """Run one Generate call to the end: (token ids, text, last message)."""
    tokens, text, last = [], "", None
    for response in stub.Generate(gateway_pb2.GenerateRequest(**fields), timeout=timeout):
        tokens += response.token_ids
        text += response.text
        last = response
    return tokens, text, last


def greedy(max_tokens: int, **extra) -> gateway_pb2.SamplingParams:
    return gateway_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)


def model_nodes(stub) -> list[gateway_pb2.NodeStatus]:
    nodes = stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10).nodes
    return [n for n in nodes if n.role in ("prefill", "decode")]


def wait_idle(stub, timeout_s: float = 20.0) -> list[gateway_pb2.NodeStatus]:
    """Poll ClusterStatus until every prefill and decode node holds nothing: no running or waiting
    request, nothing reserved, every block free or cached. Fails with the last numbers otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = model_nodes(stub)
        if all(is_idle(n) for n in nodes):
            return nodes
        if time.monotonic() > deadline:
            raise AssertionError(f"cluster not idle after {timeout_s}s: {nodes}")
        time.sleep(0.1)


def is_idle(node: gateway_pb2.NodeStatus) -> bool:
    return (node.healthy and node.requests_running == 0 and node.requests_waiting == 0
            and node.blocks_reserved == 0 and node.blocks_free + node.blocks_cached == node.blocks_total
            and node.calls_in_flight == 0)
