"""``python -m services.cluster`` (``make run``): a gateway, prefill node(s), decode node(s) and a cache-store
on loopback, serving the bundled model or ``--model PATH`` (``make run MODEL=PATH``), until Ctrl-C (exit 0) or
until one of its processes exits (named on stderr with its exit code; the rest are stopped; exit 1)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import urllib.request
from pathlib import Path

import grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, LocalCluster, key_metadata, start_cluster
from services.common.tls.ca import role_dns
from services.engine.model_files import cache_dir

USAGE = """
pdserve is up: gateway {gateway}
  model: {model}
  OpenAI-compatible HTTP: {http}
  prefill: {prefill}
  decode:  {decode}
  cache-store: {store}

Try it:
  .venv/bin/python -m services.client "Write a haiku about the sea." --chat --address {gateway}
  .venv/bin/grpcurl -plaintext {gateway} list
  .venv/bin/grpcurl -plaintext -d '{{"prompt": "The capital of France is", "sampling": {{"max_tokens": 16,
      "temperature": 0}}}}' {gateway} pdserve.v1.Gateway/Generate
  .venv/bin/grpcurl -plaintext {gateway} pdserve.v1.Gateway/ClusterStatus

From Python (the generated client: pip install protos/python):
  import grpc
  from pdserve.v1 import gateway_pb2, gateway_pb2_grpc
  stub = gateway_pb2_grpc.GatewayStub(grpc.insecure_channel("{gateway}"))
  request = gateway_pb2.GenerateRequest(prompt="Hello", sampling=gateway_pb2.SamplingParams(max_tokens=16))
  for response in stub.Generate(request):
      print(response.text, end="", flush=True)

{http_usage}{key_usage}
Metrics (Prometheus text):
{metrics}
{internal_usage}
Ctrl-C stops everything.
"""


HTTP_USAGE = """OpenAI-compatible HTTP (streaming: "stream": true):
  curl {http}/v1/models
  curl {http}/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}], "max_tokens": 32}}'
  from openai import OpenAI
  client = OpenAI(base_url="{http}/v1", api_key="unused")
  print(client.completions.create(model="{model}", prompt="The capital of France is", max_tokens=16).choices[0].text)
"""


MTLS_USAGE = """
The internal nodes speak mTLS, each with its own certificate of the cluster's CA (made for this run and
removed with it, unless --mtls-dir names ready ones). Call them as the launcher does, with its admin
certificate, naming the role the node's certificate must hold (-servername):
  .venv/bin/grpcurl {grpcurl_prefill} {prefill} pdserve.v1.PrefillNode/NodeStatus
  .venv/bin/grpcurl {grpcurl_decode} {decode} pdserve.v1.DecodeNode/NodeStatus
Drain one node as SIGTERM would (admin only):
  .venv/bin/grpcurl {grpcurl_decode} -d '{{}}' {decode} pdserve.v1.Admin/Drain
The admin certificate is also at {admin_link} while the cluster runs (the README's runbook uses it).
"""

INSECURE_USAGE = """
The internal nodes are plaintext (--insecure):
  .venv/bin/grpcurl -plaintext {decode} pdserve.v1.DecodeNode/NodeStatus
Drain one node as SIGTERM would: .venv/bin/grpcurl -plaintext -d '{{}}' {decode} pdserve.v1.Admin/Drain
"""


KEY_USAGE = """
API keys are required (health, reflection and /metrics stay open): export PDSERVE_API_KEY=<key> for
services.client, add -H "authorization: Bearer $PDSERVE_API_KEY" to grpcurl and curl, api_key=<key> to OpenAI().
"""


def grpcurl_tls(certs: Path, role: str) -> str:
    """grpcurl's flags to call a node of ``role`` with the certificate in ``certs`` (a line break after the
    files: the paths are long)."""
    ca, cert, key = (shlex.quote(str(certs / name)) for name in ("ca.crt", "tls.crt", "tls.key"))
    return (f"-cacert {ca} -cert {cert} -key {key} \\\n"
            f"      -servername {role_dns(role)}")


def internal_usage(cluster: LocalCluster) -> str:
    """grpcurl lines for the internal nodes: mTLS with the launcher's admin certificate, or plaintext."""
    prefill, decode = cluster.prefill[0].address, cluster.decode[0].address
    if cluster.identity is None:
        return INSECURE_USAGE.format(decode=decode)
    certs = cluster.identity.directory
    return MTLS_USAGE.format(prefill=prefill, decode=decode, grpcurl_prefill=grpcurl_tls(certs, "prefill"),
                             grpcurl_decode=grpcurl_tls(certs, "decode"), admin_link=admin_link(cluster.address))


def admin_link(gateway: str) -> Path:
    """Where the launcher links its admin certificate directory: ``$PDSERVE_CACHE_DIR/run/<gateway port>/admin``
    (default ``~/.cache/pdserve/run/50051/admin`` under ``make run``), a fixed path the runbook can name."""
    return cache_dir() / "run" / gateway.rsplit(":", 1)[-1] / "admin"


@contextlib.contextmanager
def linked_admin_certificate(cluster: LocalCluster):
    """:func:`admin_link` → the launcher's admin certificate directory while the cluster runs (none when
    insecure); removed when it stops."""
    if cluster.identity is None:
        yield None
        return
    link = admin_link(cluster.address)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)  # a cluster on this port before that did not stop cleanly
    link.symlink_to(cluster.identity.directory, target_is_directory=True)
    try:
        yield link
    finally:
        link.unlink(missing_ok=True)


def http_usage(http_url: str, api_key: str = "") -> str:
    if not http_url:
        return ""
    request = urllib.request.Request(f"{http_url}/v1/models", headers=dict(key_metadata(api_key) or ()))
    with urllib.request.urlopen(request, timeout=10) as reply:
        model = json.load(reply)["data"][0]["id"]
    return HTTP_USAGE.format(http=http_url, model=model)


def cluster_status(gateway: str, api_key: str = "") -> gateway_pb2.ClusterStatusResponse:
    with grpc.insecure_channel(gateway) as channel:
        return gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10,
                                                                   metadata=key_metadata(api_key))


def model_line(gateway: str, api_key: str = "") -> str:
    """``served name (model name, weights digest)``, from the gateway's ClusterStatus."""
    status = cluster_status(gateway, api_key)
    return f"{status.served_model_name} ({status.model_name}, weights {status.weights_digest[:12]})"


def metrics_lines(gateway: str, api_key: str = "") -> str:
    """``role  url`` of every process, from the gateway's ClusterStatus."""
    status = cluster_status(gateway, api_key)
    rows = [("gateway", status.gateway_metrics_url), *((n.role, n.metrics_url) for n in status.nodes)]
    return "\n".join(f"  {role:12s} {url}" for role, url in rows if url) or "  (none)"


def _resolved(template: str) -> str:
    """A template file's absolute path (the gateway may run elsewhere: ``ClusterSpec.cwd``); a template's text,
    or a missing file the gateway will name, as it is."""
    try:
        return str(Path(template).resolve()) if Path(template).is_file() else template
    except OSError:  # a template's text longer than a file name can be
        return template


def parse_spec(argv: list[str] | None = None) -> ClusterSpec:
    parser = argparse.ArgumentParser(prog="python -m services.cluster", description=__doc__)
    parser.add_argument("--gateway", default="127.0.0.1:50051", help="gateway host:port")
    parser.add_argument("--http", default="127.0.0.1:8000",
                        help="host:port of the gateway's OpenAI-compatible HTTP front; empty = off")
    parser.add_argument("--prefill-nodes", type=int, default=1)
    parser.add_argument("--decode-nodes", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per model node")
    parser.add_argument("--model", default="", help="GGUF file or HF directory that the gateway (tokenizer, "
                        "config) and every node (weights) load; default: the bundled SmolLM2-135M")
    parser.add_argument("--served-model-name", default="",
                        help="the model id of the HTTP front (/v1/models); default: the model file's name")
    parser.add_argument("--max-model-len", type=int, default=0,
                        help="context length of the gateway and every node; 0 = the model's")
    parser.add_argument("--chat-template", default="",
                        help="the gateway's chat template instead of the model's own (a Jinja file or its text)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="the gateway and every node run a tokenizer class the model directory brings "
                             "(tokenizer_config.json's auto_map: Kimi K2, Moonlight)")
    parser.add_argument("--api-key", default=os.environ.get("PDSERVE_API_KEY", ""),
                        help="the gateway's API key(s), comma-separated (default: $PDSERVE_API_KEY); empty = open")
    parser.add_argument("--insecure", action="store_true",
                        help="internal ports and calls in plaintext, without mTLS (development only)")
    parser.add_argument("--mtls-dir", type=Path, default=None,
                        help="the cluster's certificates: a directory with ca/ca.key (its CA signs a certificate "
                             "per process) or one directory of ca.crt, tls.crt, tls.key per role; default: "
                             "$PDSERVE_MTLS_DIR, else a throwaway CA made at start")
    parser.add_argument("--no-store-prefixes", dest="store_prefixes", action="store_false",
                        help="prefill nodes do not share prompt blocks through the cache-store")
    args = parser.parse_args(argv)
    if args.model and not Path(args.model).exists():
        parser.error(f"--model {args.model}: no such file or directory")
    if args.max_model_len < 0:
        parser.error(f"--max-model-len must be >= 0, got {args.max_model_len}")
    if args.insecure and args.mtls_dir is not None:
        parser.error("--insecure and --mtls-dir: choose one (plaintext, or mTLS with these certificates)")
    if args.mtls_dir is not None and not args.mtls_dir.is_dir():
        parser.error(f"--mtls-dir {args.mtls_dir}: no such directory")
    return ClusterSpec(num_prefill=args.prefill_nodes, num_decode=args.decode_nodes, gateway_listen=args.gateway,
                       http_listen=args.http, model=str(Path(args.model).resolve()) if args.model else "",
                       served_model_name=args.served_model_name, max_model_len=args.max_model_len,
                       trust_remote_code=args.trust_remote_code,
                       gateway_args=("--chat-template", _resolved(args.chat_template)) if args.chat_template else (),
                       engine_args=("--dtype", args.dtype, "--threads", str(args.threads)),
                       prefill_cache_store=args.store_prefixes, api_key=args.api_key, insecure=args.insecure,
                       mtls_dir=args.mtls_dir.resolve() if args.mtls_dir is not None else None)


def main(argv: list[str] | None = None) -> int:
    spec = parse_spec(argv)
    stop = threading.Event()
    # while starting, Ctrl-C or SIGTERM unwinds the start at once (KeyboardInterrupt): each process started so
    # far gets its SIGTERM (they ignore the terminal's SIGINT, see services.common.launch); set here, not
    # inherited, as the handlers after the start are (make's children start with SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    model = spec.model or "the bundled SmolLM2-135M"
    sys.stdout.write(f"starting the cluster (loading {model} in each node)...\n")
    sys.stdout.flush()
    try:
        return _serve(spec, model, stop)
    except KeyboardInterrupt:
        sys.stdout.write("stopped while starting\n")
        return 130


def _serve(spec: ClusterSpec, model: str, stop: threading.Event) -> int:
    with start_cluster(spec) as cluster, linked_admin_certificate(cluster):
        signal.signal(signal.SIGINT, lambda *_: stop.set())  # up: stop in order, each process drained once
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        sys.stdout.write(USAGE.format(
            gateway=cluster.address, model=model_line(cluster.address, spec.api_key), http=cluster.http_url or "off",
            http_usage=http_usage(cluster.http_url, spec.api_key), key_usage=KEY_USAGE if spec.api_key else "",
            prefill=", ".join(p.address for p in cluster.prefill),
            decode=", ".join(d.address for d in cluster.decode),
            store=cluster.cache_store.address if cluster.cache_store else "-",
            metrics=metrics_lines(cluster.address, spec.api_key),
            internal_usage=internal_usage(cluster)))
        sys.stdout.flush()
        code = run_until_stopped(cluster, stop)
        sys.stdout.write("stopping...\n")
    return code


def run_until_stopped(cluster: LocalCluster, stop: threading.Event, poll_s: float = 0.5) -> int:
    """Wait for Ctrl-C/SIGTERM (0) or a lost process (1: each lost one named on stderr; the caller stops the
    rest — a cluster does not run on without a process)."""
    while not stop.wait(poll_s):
        if lost := cluster.lost():
            for line in lost:
                sys.stderr.write(f"error: {line}; stopping the cluster\n")
            sys.stderr.flush()
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
