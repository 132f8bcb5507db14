"""Start gateway, prefill nodes, decode nodes and a cache-store as processes on loopback, and stop them.

Used by ``make run`` and by the end-to-end tests. Every process starts at once: the cache-store and the
nodes on ports chosen by the launcher (``ports.unused_port``), so the gateway and the nodes are given their
peers' addresses before those serve, and the gateway's start overlaps the nodes' model loads. Each is waited
for until its health check says SERVING, then the gateway until it has heard from every node (its polls
reach a node within a second of it serving). A chosen port someone else bound first starts it all again.
On exit the gateway drains first, then every node gets SIGTERM at once (their drains side by side), then the
cache-store; SIGKILL for any that lingers.
:meth:`LocalCluster.lost` names the processes that exited while the cluster ran (``make run`` stops the
cluster then, instead of running on without them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.certificates import ClusterCertificates
from services.common.launch import ROLE_OF_MODULE, ServiceProcess, launch
from services.common.ports import PortTaken, StartupError, unused_port
from services.common.tls.identity import Identity


@dataclass(frozen=True)
class ClusterSpec:
    num_prefill: int = 1
    num_decode: int = 1
    cache_store: bool = True
    gateway_listen: str = "127.0.0.1:0"
    http_listen: str = ""  # the gateway's OpenAI-compatible HTTP front (port 0 = ephemeral); empty = off
    model: str = ""  # GGUF file or HF directory for the gateway and every node; empty = the bundled model
    served_model_name: str = ""  # the gateway's model id (/v1/models); empty = from the model's file name
    max_model_len: int = 0  # context length of the gateway and every node; 0 = the model's
    trust_remote_code: bool = False  # the gateway and every node run a tokenizer class the model directory brings
    engine_args: tuple[str, ...] = ()  # passed to every prefill and decode node (e.g. --dtype float32)
    prefill_args: tuple[str, ...] = ()
    decode_args: tuple[str, ...] = ()
    gateway_args: tuple[str, ...] = ()
    api_key: str = field(default="", repr=False)  # the gateway's API key(s), comma-separated (via its env); "" = open
    offload_to_cache_store: bool = False  # decode nodes keep preempted KV in the cache-store past their host budget
    prefill_cache_store: bool = False  # prefill nodes fetch prompt blocks from the cache-store and write theirs back
    startup_timeout_s: float = 120.0
    insecure: bool = False  # internal ports and calls in plaintext (every process gets PDSERVE_INSECURE=true)
    # the cluster's certificates (``certificates.ClusterCertificates``); None: $PDSERVE_MTLS_DIR, else a
    # throwaway CA made at start
    mtls_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # set in every process (OTEL_*, PDSERVE_*)
    cwd: Path | None = None  # run the services from another checkout (a benchmark's baseline)

    def model_args(self) -> tuple[str, ...]:
        """The flags every process that loads the model gets (gateway, prefill and decode nodes)."""
        return ((("--model", self.model) if self.model else ())
                + (("--max-model-len", str(self.max_model_len)) if self.max_model_len else ())
                + (("--trust-remote-code",) if self.trust_remote_code else ()))

    def node_args(self, role: str) -> tuple[str, ...]:
        """A prefill or decode node's flags, before the cache-store's."""
        return (*self.model_args(), *self.engine_args, *(self.prefill_args if role == "prefill" else self.decode_args))

    def gateway_model_args(self) -> tuple[str, ...]:
        return (*self.model_args(), *(("--served-model-name", self.served_model_name)
                                      if self.served_model_name else ()))


@dataclass
class LocalCluster:
    gateway: ServiceProcess
    prefill: list[ServiceProcess] = field(default_factory=list)
    decode: list[ServiceProcess] = field(default_factory=list)
    cache_store: ServiceProcess | None = None
    http_url: str = ""  # http://HOST:PORT of the gateway's HTTP front (ClusterStatus.http_url); empty = off
    identity: Identity | None = None  # the launcher's admin identity: calls the nodes (None: --insecure)

    @property
    def address(self) -> str:
        return self.gateway.address

    def processes(self) -> list[tuple[str, ServiceProcess]]:
        """Every process with its name: ``gateway``, ``prefill node 1``, …, ``cache-store``."""
        named = [("gateway", self.gateway), *((f"prefill node {i}", p) for i, p in enumerate(self.prefill, 1)),
                 *((f"decode node {i}", d) for i, d in enumerate(self.decode, 1))]
        return named + ([("cache-store", self.cache_store)] if self.cache_store is not None else [])

    def lost(self) -> list[str]:
        """The processes that exited (none should before the cluster is stopped), each as ``NAME (ADDRESS)
        exited with code N`` (or ``was killed by SIGNAL``)."""
        return [f"{name} ({process.address}) {_exit_status(code)}" for name, process in self.processes()
                if (code := process.process.poll()) is not None]


def _exit_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


@contextlib.contextmanager
def start_cluster(spec: ClusterSpec = ClusterSpec(), stdout: int | None = None,
                  stderr: int | None = None) -> Iterator[LocalCluster]:
    for attempt in range(1, _START_ATTEMPTS + 1):
        with contextlib.ExitStack() as stack:
            try:
                cluster = _start(stack, spec, stdout, stderr)
            except PortTaken:  # another process bound a port chosen for a node first: start again, elsewhere
                if attempt == _START_ATTEMPTS:
                    raise
                continue
            stack.callback(_terminate_all, cluster)  # runs first on exit: the gateway, then the nodes side by side
            yield cluster
            return


_START_ATTEMPTS = 3


def _start(stack: contextlib.ExitStack, spec: ClusterSpec, stdout: int | None, stderr: int | None) -> LocalCluster:
    """Start every process at once, each node on a port chosen here (``ports.unused_port``), so that the
    gateway and the nodes get their peers' addresses before those serve; then wait for all of them, and for
    the gateway to have heard from every node."""
    security = _Security.of(spec, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pdserve-"))))

    def start(module: str, *args: str, index: int = 1, env: Mapping[str, str] | None = None,
              port: int = 0) -> ServiceProcess:
        return stack.enter_context(launch(module, *args, *security.args(module, index),
                                          startup_timeout_s=spec.startup_timeout_s,
                                          env={**spec.env, **security.env, **(env or {})}, cwd=spec.cwd,
                                          stdout=stdout, stderr=stderr, identity=security.identity, wait=False,
                                          port=port))

    chosen: list[int] = []

    def port() -> int:  # one that no other process of this cluster was given
        chosen.append(unused_port(avoid=chosen))
        return chosen[-1]

    store = start("services.cache_store", port=port()) if spec.cache_store else None
    decode_args = spec.node_args("decode")
    if store is not None and spec.offload_to_cache_store:
        decode_args += ("--offload-cache-store", store.address)
    prefill_args = spec.node_args("prefill")
    if store is not None and spec.prefill_cache_store:
        prefill_args += ("--cache-store", store.address)
    decode = [start("services.decode_node", *decode_args, index=i, port=port()) for i in range(1, spec.num_decode + 1)]
    prefill = [start("services.prefill_node", *prefill_args, index=i, port=port())
               for i in range(1, spec.num_prefill + 1)]
    gateway_args = ["--prefill", ",".join(p.address for p in prefill),
                    "--decode", ",".join(d.address for d in decode), *spec.gateway_model_args(),
                    *spec.gateway_args]
    if store is not None:
        gateway_args += ["--cache-store", store.address]
    if spec.http_listen:
        gateway_args += ["--http-listen", spec.http_listen]
    key_env = {"PDSERVE_API_KEY": spec.api_key} if spec.api_key else None  # not a flag: ps shows flags
    gateway = start("services.gateway", *gateway_args, "--listen", spec.gateway_listen, env=key_env)
    processes = [*([store] if store is not None else []), *decode, *prefill, gateway]
    for process in processes:
        process.wait_serving(spec.startup_timeout_s)
    wait_until_polled(gateway.address, len(prefill) + len(decode), spec.api_key, spec.startup_timeout_s,
                      processes)
    http_url = http_url_of(gateway.address, spec.api_key) if spec.http_listen else ""
    return LocalCluster(gateway, prefill, decode, store, http_url, security.identity)


def wait_until_polled(gateway: str, num_nodes: int, api_key: str = "", timeout_s: float = 120.0,
                      processes: Sequence[ServiceProcess] = ()) -> None:
    """Wait until the gateway's ``ClusterStatus`` has an answer from each of its ``num_nodes`` model nodes
    (healthy, or left out for what it reported: a test's mismatched node), as a gateway started after its
    nodes has from its first poll. A gateway that does not answer ``ClusterStatus`` here (a key this
    launcher lacks) is not waited for. :class:`StartupError` at once when one of ``processes`` (the cluster's)
    exits, or when the gateway fails the call; past ``timeout_s``, naming each node not heard from and why."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(gateway) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        while True:
            exited = [f"{p.module} ({p.address}) {_exit_status(code)}" for p in processes
                      if (code := p.process.poll()) is not None]
            if exited:
                raise StartupError(f"while the gateway {gateway} polled its nodes: {'; '.join(exited)}")
            try:
                status = stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10,
                                            metadata=key_metadata(api_key))
            except grpc.RpcError as error:
                if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    return
                raise StartupError(f"the gateway {gateway} failed ClusterStatus: {error.code().name}: "
                                   f"{error.details()}") from None
            nodes = [n for n in status.nodes if n.role in ("prefill", "decode")]
            unheard = [n for n in nodes if not n.healthy and not n.model_name]
            if len(nodes) >= num_nodes and not unheard:
                return
            if time.monotonic() > deadline:
                said = "; ".join(f"{n.address}: {n.error or 'no answer'}" for n in unheard)
                raise StartupError(f"the gateway {gateway} lists {len(nodes)} of {num_nodes} model nodes and has "
                                   f"not heard from {len(unheard)} after {timeout_s:.1f}s ({said or 'none'})")
            time.sleep(_POLL_S)


_POLL_S = 0.05


def _terminate_all(cluster: LocalCluster) -> None:
    """Stop the gateway first and wait for it: its drain lets the streams in flight finish (or ends them)
    while the nodes behind them still serve. Then SIGTERM to every prefill and decode node at once, so
    their drains overlap; each ``launch`` waits for its own process's exit (SIGKILL past its stop timeout),
    the cache-store's last, after the decode nodes that may write to it while draining."""
    cluster.gateway.stop()
    for process in (*cluster.prefill, *cluster.decode):
        process.terminate()


def key_metadata(api_key: str) -> tuple[tuple[str, str], ...] | None:
    """The gRPC metadata that carries the first of ``api_key``'s keys; None without one."""
    first = next((k.strip() for k in api_key.split(",") if k.strip()), "")
    return (("authorization", f"Bearer {first}"),) if first else None


def http_url_of(gateway: str, api_key: str = "") -> str:
    """The bound URL of the gateway's HTTP front (its port may be ephemeral), from ``ClusterStatus``."""
    with grpc.insecure_channel(gateway) as channel:
        status = gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10,
                                                                     metadata=key_metadata(api_key))
    return status.http_url


@dataclass
class _Security:
    """Each process's ``--mtls-dir`` (its own certificate) or ``--insecure``, and the launcher's identity."""

    certificates: ClusterCertificates | None
    identity: Identity | None

    @classmethod
    def of(cls, spec: ClusterSpec, scratch: Path) -> _Security:
        if spec.insecure:
            return cls(None, None)
        given = spec.mtls_dir or (Path(os.environ["PDSERVE_MTLS_DIR"]) if os.environ.get("PDSERVE_MTLS_DIR")
                                  else None)
        certificates = ClusterCertificates.prepare(given, scratch)
        return cls(certificates, certificates.admin())

    @property
    def env(self) -> dict[str, str]:
        return {"PDSERVE_INSECURE": "true"} if self.certificates is None else {}

    def args(self, module: str, index: int) -> tuple[str, ...]:
        if self.certificates is None:
            return ()  # PDSERVE_INSECURE instead (env): a baseline checkout from before mTLS ignores it
        role = ROLE_OF_MODULE.get(module, "gateway")
        return ("--mtls-dir", str(self.certificates.directory(f"{role}-{index}", role)))
