"""Internal mTLS with caller roles on ONE real cluster (gateway with an Admin port, prefill, decode,
cache-store; the session CA): every internal method refuses every role the table does not name; callers
without a cluster certificate never get past the handshake; the poisoning calls of the issue are refused
and change nothing; a certificate is rotated without a restart; afterwards every pool is idle and a normal
request is served. Tests run in file order: ``Admin/Drain`` by the admin role comes last."""

from __future__ import annotations

import datetime
import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2
from pdserve.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    cache_store_pb2,
    cache_store_pb2_grpc,
    decode_pb2,
    decode_pb2_grpc,
    gateway_pb2_grpc,
    node_pb2,
)

from services.cluster.local import ClusterSpec, start_cluster
from services.common.ports import free_port
from services.common.tls.ca import ClusterCA
from services.common.tls.channels import open_sync_channel
from services.common.tls.identity import Identity
from tests.common.tls_certs import serial_of
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy, model_nodes, wait_idle
from tests.e2e.mtls_calls import (
    ADMIN,
    SERVICES,
    Method,
    channels_without_certificate,
    health,
    methods_of,
    refusal,
    served_certificate,
)
from tests.tls_identities import foreign_identity, identity_of, session_root

pytestmark = pytest.mark.slow
SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def cluster():
    admin_listen = f"127.0.0.1:{free_port()}"
    spec = ClusterSpec(engine_args=ENGINE_ARGS, gateway_args=(*GATEWAY_ARGS, "--admin-listen", admin_listen),
                       prefill_cache_store=True)
    with start_cluster(spec, stderr=subprocess.DEVNULL) as running:
        running.admin_address = admin_listen  # type: ignore[attr-defined]
        yield running


@pytest.fixture(scope="module")
def stub(cluster):
    with grpc.insecure_channel(cluster.address) as channel:  # the public port: plaintext, no role check
        yield gateway_pb2_grpc.GatewayStub(channel)


def targets(cluster) -> dict[str, str]:
    """Role → address of each internal process (the gateway's internal side is its Admin port)."""
    return {"prefill": cluster.prefill[0].address, "decode": cluster.decode[0].address,
            "cache-store": cluster.cache_store.address, "gateway": cluster.admin_address}


def every_process(cluster) -> list:
    return [cluster.gateway, *cluster.prefill, *cluster.decode, cluster.cache_store]


CASES = [(role, m) for role, service in SERVICES.items() for m in methods_of(service)] + [
    (role, m) for role in ("prefill", "decode", "cache-store", "gateway") for m in methods_of(ADMIN)]


@pytest.mark.parametrize(("target", "method"), CASES, ids=[f"{t}:{m.name}" for t, m in CASES])
def test_every_internal_method_refuses_every_role_it_does_not_name(cluster, target, method: Method):
    address = targets(cluster)[target]
    for role in method.wrong_roles():
        with open_sync_channel(address, target, identity=identity_of(role)) as channel:
            error = refusal(channel, method)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (role, error)
        assert error.details().startswith(f"{method.name}: a caller with role {role} may not call it"), error.details()


def test_the_public_gateway_port_does_not_serve_admin(cluster):
    with grpc.insecure_channel(cluster.address) as channel, pytest.raises(grpc.RpcError) as refused:
        admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest(reason="from the internet"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("target", ["prefill", "decode", "cache-store", "gateway"])
def test_a_caller_without_a_cluster_certificate_fails_the_handshake(cluster, target):
    address = targets(cluster)[target]
    status = Method(f"/{SERVICES['prefill'].full_name}/NodeStatus", False, False)  # open to every role
    for kind, channel in channels_without_certificate(address, target, foreign_identity("admin")):
        with channel:
            error = refusal(channel, status)
        assert error.code() == grpc.StatusCode.UNAVAILABLE, (kind, error)
    assert health(address, target) == SERVING
    assert all(p.process.poll() is None for p in every_process(cluster))


def decode_reserved(cluster) -> int:
    with open_sync_channel(cluster.decode[0].address, "decode", identity=identity_of("gateway")) as channel:
        return decode_pb2_grpc.DecodeNodeStub(channel).NodeStatus(node_pb2.NodeStatusRequest(),
                                                                  timeout=10).blocks_reserved


def store_contents(cluster) -> tuple[int, int]:
    with open_sync_channel(cluster.cache_store.address, "cache-store", identity=identity_of("admin")) as channel:
        status = cache_store_pb2_grpc.CacheStoreStub(channel).NodeStatus(node_pb2.NodeStatusRequest(), timeout=10)
    return status.blocks_total, status.bytes_used


def written_back(stub) -> int:
    """Blocks the prefill node has written to the cache-store so far."""
    return next(n for n in model_nodes(stub) if n.role == "prefill").store_written_blocks_total


def written_back_after(stub, before: int, timeout_s: float = 30.0) -> int:
    """Wait until the prefill node's write-back (it follows the request's end, in the background) has written past
    ``before`` and stopped there; the count then."""
    deadline, last = time.monotonic() + timeout_s, before
    while True:
        now = written_back(stub)
        if last > before and now == last:
            return now
        assert time.monotonic() < deadline, f"the prefill node wrote nothing back ({now} blocks)"
        last = now
        time.sleep(0.2)


def denied(call) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value


@pytest.mark.parametrize("role", ["gateway", "admin"])
def test_no_gateway_or_admin_identity_can_put_kv_into_a_decode_node(cluster, stub, role):
    # a prompt of several full blocks (its own for each role), written back to the cache-store: something there to
    # protect; compared once the write-back, which follows the request's end, has landed
    written = written_back(stub)
    generate(stub, prompt=f"{role}: " + "Shared prefixes are cached and reused by later requests. " * 8,
             sampling=greedy(4))
    written_back_after(stub, written)
    before = (decode_reserved(cluster), store_contents(cluster))
    with open_sync_channel(cluster.decode[0].address, "decode", identity=identity_of(role)) as channel:
        decode = decode_pb2_grpc.DecodeNodeStub(channel)
        denied(lambda: decode.Reserve(decode_pb2.ReserveRequest(request_id=f"poison-{role}",
                                                                prompt_token_ids=list(range(1, 40)), max_tokens=4),
                                      timeout=10))
        denied(lambda: next(iter(decode.TransferKV(iter([decode_pb2.KVTransferMessage()]), timeout=10))))
        # a gateway may hand a request over as tokens only (resume.py), never with KV keys to read
        denied(lambda: decode.Adopt(decode_pb2.AdoptRequest(
            request_id=f"adopt-{role}", prompt_token_ids=[1, 2, 3], output_token_ids=[4], num_computed_tokens=3,
            kv_keys=[b"\x00" * 48], cache_store=cluster.cache_store.address), timeout=10))
    with open_sync_channel(cluster.cache_store.address, "cache-store", identity=identity_of(role)) as channel:
        store = cache_store_pb2_grpc.CacheStoreStub(channel)
        chunk = cache_store_pb2.PutChunk(key=b"\x00" * 48, total_length=4, data=b"evil")
        denied(lambda: store.Put(iter([chunk]), timeout=10))
        denied(lambda: store.Delete(cache_store_pb2.DeleteRequest(keys=[b"\x00" * 48]), timeout=10))
    assert (decode_reserved(cluster), store_contents(cluster)) == before
    assert before[1][0] > 0, "the prompt's blocks were written back to the cache-store"


def test_a_prefill_identity_can_neither_attach_nor_adopt(cluster):
    with open_sync_channel(cluster.decode[0].address, "decode", identity=identity_of("prefill")) as channel:
        decode = decode_pb2_grpc.DecodeNodeStub(channel)
        denied(lambda: next(iter(decode.Attach(decode_pb2.AttachRequest(request_id="someone-else"), timeout=10))))
        denied(lambda: decode.Adopt(decode_pb2.AdoptRequest(request_id="stolen", prompt_token_ids=[1, 2, 3],
                                                            output_token_ids=[4]), timeout=10))
    assert decode_reserved(cluster) == 0


def wait_for_serial(address: str, role: str, serial: int, timeout_s: float = 30.0) -> None:
    """New connections present the certificate of ``serial`` (the server re-reads its files at most once
    a second, at a handshake)."""
    deadline = time.monotonic() + timeout_s
    while (seen := served_certificate(address, role).serial_number) != serial:
        assert time.monotonic() < deadline, f"still serving serial {seen}, not {serial}"
        time.sleep(0.2)


def test_a_certificate_is_rotated_without_a_restart(cluster, stub):
    """The launcher issued each process's certificate from the session CA into its own directory
    (``LocalCluster.identity`` is the launcher's, beside them): a new one written there is what the next
    connection sees, while the process (same pid) keeps serving, old connections included."""
    node = cluster.decode[0]
    directory = cluster.identity.directory.parent / "decode-1"
    assert Identity(directory).roles == {"decode"}
    old = served_certificate(node.address, "decode")
    assert old.serial_number == serial_of(directory)  # it serves the certificate of that directory
    pid = node.process.pid
    kept = open_sync_channel(node.address, "decode", identity=identity_of("gateway"))  # opened before
    status = decode_pb2_grpc.DecodeNodeStub(kept).NodeStatus
    assert status(node_pb2.NodeStatusRequest(), timeout=10).healthy
    ClusterCA.load(session_root() / "ca").issue(directory, ("decode",), name="decode-1 rotated",
                                                valid=datetime.timedelta(days=2))
    new_serial = serial_of(directory)
    assert new_serial != old.serial_number
    wait_for_serial(node.address, "decode", new_serial)
    rotated = served_certificate(node.address, "decode")
    assert rotated.not_valid_after_utc - rotated.not_valid_before_utc < datetime.timedelta(days=3)
    assert status(node_pb2.NodeStatusRequest(), timeout=10).healthy  # the connection from before still works
    kept.close()
    assert decode_reserved(cluster) == 0  # a new channel: handshake with the new certificate
    assert node.process.poll() is None and node.process.pid == pid
    tokens, _, last = generate(stub, prompt="After the rotation,", sampling=greedy(6))  # prefill → decode
    assert len(tokens) == 6 and last.finish_reason == "length"


def test_after_all_of_it_every_pool_is_idle_and_a_request_is_served(cluster, stub):
    assert cluster.lost() == []
    nodes = wait_idle(stub)
    assert {n.role for n in nodes} == {"prefill", "decode"} and all(n.healthy for n in nodes)
    tokens, text, last = generate(stub, prompt="The capital of France is", sampling=greedy(8))
    assert len(tokens) == 8 and text and last.finish_reason == "length"
    wait_idle(stub)
    for role, address in targets(cluster).items():
        assert health(address, role) == SERVING


def test_admin_drain_is_served_to_the_admin_role(cluster):
    """Last: drains the cache-store (wrong roles were refused above, the node unharmed)."""
    store = cluster.cache_store
    with open_sync_channel(store.address, "cache-store", identity=identity_of("admin")) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest(reason="test"), timeout=10)
    assert reply.already_draining is False
    assert store.process.wait(60) == 0
