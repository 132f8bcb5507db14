"""The README's runbook, run as written against a live cluster (1 prefill, 2 decode nodes, cache-store).

The commands come from the README block between ``<!-- runbook:start -->`` and ``<!-- runbook:end -->``;
the test sets ``G`` (the gateway), ``N`` (a node) and ``D`` (a certificate directory of the cluster's CA
holding the ``admin`` role: ``ca.crt``, ``tls.crt``, ``tls.key``; the nodes' ports are mTLS) and runs each line
with bash. Rebalancing (its stream moves to the other decode node) then draining a decode node with
``Admin/Drain`` while it generates: the request finishes in full, the
node exits 0, the gateway sees it go and serves the next request on the other decode node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, greedy
from tests.tls_identities import session_root

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def runbook_lines() -> list[str]:
    """The runbook's lines, without comments."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- runbook:start -->\s*```bash\n(.*?)```\s*<!-- runbook:end -->", readme, re.S)
    assert block, "README.md has no runbook block"
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in block.group(1).splitlines())
    return [line for line in lines if line]


def runbook_commands() -> list[str]:
    """The runbook's command lines, without the ``G=``/``N=``/``D=`` assignments."""
    return [line for line in runbook_lines() if not re.match(r"[A-Z]+=", line)]


def assignment(name: str) -> str:
    (line,) = [line for line in runbook_lines() if line.startswith(f"{name}=")]
    return line


def command_for(rpc: str, target: str) -> str:
    """The one runbook command that calls ``rpc`` on ``$G`` or ``$N``."""
    found = [c for c in runbook_commands() if c.endswith(f"{target} {rpc}")]
    assert len(found) == 1, f"the runbook should have one `{target} {rpc}` command, has {found}"
    return found[0]


def run(command: str, **env: str) -> str:
    admin = {"D": str(session_root() / "admin")}  # the session CA's admin certificate (tests/conftest.py)
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env={**os.environ, **admin, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    return done.stdout


def json_messages(text: str) -> list[dict]:
    """grpcurl prints a stream as consecutive JSON objects."""
    decoder, messages, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        message, at = decoder.raw_decode(text, at)
        messages.append(message)
        while at < len(text) and text[at].isspace():
            at += 1
    return messages


def test_every_runbook_command_is_checked_here():
    rpcs = sorted(c.rsplit(" ", 1)[-1] for c in runbook_commands())
    assert rpcs == sorted(["list", "grpc.health.v1.Health/Check", "pdserve.v1.Gateway/ClusterStatus",
                           "pdserve.v1.Gateway/Generate", "grpc.health.v1.Health/Check", "pdserve.v1.Admin/Drain",
                           "pdserve.v1.Admin/Rebalance"])


def test_runbook_against_a_live_cluster():
    spec = ClusterSpec(num_decode=2, engine_args=ENGINE_ARGS, gateway_args=GATEWAY_ARGS)
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster, \
            grpc.insecure_channel(cluster.address) as channel:
        G = cluster.address
        listed = set(run(command_for("list", "$G"), G=G).split())
        assert {"pdserve.v1.Gateway", "grpc.health.v1.Health"} <= listed
        assert "pdserve.v1.Admin" not in listed  # not on the public port (only on --admin-listen, mTLS)
        assert json.loads(run(command_for("grpc.health.v1.Health/Check", "$G"), G=G)) == {"status": "SERVING"}

        status = json.loads(run(command_for("pdserve.v1.Gateway/ClusterStatus", "$G"), G=G))
        roles = sorted(n["role"] for n in status["nodes"])
        assert roles == ["cache_store", "decode", "decode", "prefill"]
        assert all(n["healthy"] for n in status["nodes"])

        generated = json_messages(run(command_for("pdserve.v1.Gateway/Generate", "$G"), G=G))
        assert "".join(m.get("text", "") for m in generated).startswith(" Paris")
        assert generated[-1]["finish_reason"] in ("length", "stop")

        # The runbook's N= line names a decode node of the cluster (from ClusterStatus: make run's ports vary)
        named = run(f"{assignment('N')} && echo $N", G=G).strip()
        assert named in {d.address for d in cluster.decode}, named

        # A long generation in flight on one decode node; drain that node with the runbook's commands.
        stub = gateway_pb2_grpc.GatewayStub(channel)
        call = stub.Generate(gateway_pb2.GenerateRequest(prompt="Count slowly:", sampling=greedy(80)), timeout=120)
        first = next(call)
        N = first.decode_node
        drained = next(d for d in cluster.decode if d.address == N)
        other = next(d for d in cluster.decode if d.address != N)
        assert json.loads(run(command_for("grpc.health.v1.Health/Check", "$N"), N=N)) == {"status": "SERVING"}
        rebalanced = json.loads(run(command_for("pdserve.v1.Admin/Rebalance", "$N"), N=N))
        assert len(rebalanced.get("moved", [])) == 1, f"the stream moves to the other decode node: {rebalanced}"
        reply = json.loads(run(command_for("pdserve.v1.Admin/Drain", "$N"), N=N))
        assert not reply.get("already_draining", reply.get("alreadyDraining", False))

        tokens = list(first.token_ids)
        for response in call:
            tokens += response.token_ids
            last = response
        assert last.finish_reason == "length" and len(tokens) == 80, "the in-flight request was cut short"
        assert drained.process.wait(timeout=60) == 0

        deadline = time.monotonic() + 10
        while True:  # the gateway notices the node went away
            status = json.loads(run(command_for("pdserve.v1.Gateway/ClusterStatus", "$G"), G=G))
            if not next(n for n in status["nodes"] if n["address"] == N).get("healthy", False):
                break
            assert time.monotonic() < deadline, "the drained node is still reported healthy"
            time.sleep(0.2)
        after = json_messages(run(command_for("pdserve.v1.Gateway/Generate", "$G"), G=G))
        assert after[0]["decode_node"] == other.address
        assert after[-1]["finish_reason"] in ("length", "stop")
