"""``python -m services.cluster`` (``make run``): a gateway, prefill node(s), decode node(s) and a cache-store
on loopback with the bundled model, until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster

USAGE = """
pdserve is up: gateway {gateway}
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

Metrics (Prometheus text):
{metrics}
Drain one node as SIGTERM would: .venv/bin/grpcurl -plaintext -d '{{}}' <node address> pdserve.v1.Admin/Drain

Ctrl-C stops everything.
"""


def metrics_lines(gateway: str) -> str:
    """``role  url`` of every process, from the gateway's ClusterStatus."""
    with grpc.insecure_channel(gateway) as channel:
        status = gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10)
    rows = [("gateway", status.gateway_metrics_url), *((n.role, n.metrics_url) for n in status.nodes)]
    return "\n".join(f"  {role:12s} {url}" for role, url in rows if url) or "  (none)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gateway", default="127.0.0.1:50051", help="gateway host:port")
    parser.add_argument("--prefill-nodes", type=int, default=1)
    parser.add_argument("--decode-nodes", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per model node")
    parser.add_argument("--no-store-prefixes", dest="store_prefixes", action="store_false",
                        help="prefill nodes do not share prompt blocks through the cache-store")
    args = parser.parse_args(argv)
    spec = ClusterSpec(num_prefill=args.prefill_nodes, num_decode=args.decode_nodes, gateway_listen=args.gateway,
                       engine_args=("--dtype", args.dtype, "--threads", str(args.threads)),
                       prefill_cache_store=args.store_prefixes)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sys.stdout.write("starting the cluster (loading the model in each node)...\n")
    with start_cluster(spec) as cluster:
        sys.stdout.write(USAGE.format(
            gateway=cluster.address, prefill=", ".join(p.address for p in cluster.prefill),
            decode=", ".join(d.address for d in cluster.decode),
            store=cluster.cache_store.address if cluster.cache_store else "-", metrics=metrics_lines(cluster.address)))
        sys.stdout.flush()
        stop.wait()
        sys.stdout.write("stopping...\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
