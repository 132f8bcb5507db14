"""``python -m services.client`` against a live cluster: its sampling flags reach the gateway (the text
equals gRPC ``Generate`` with the same fields), and a value the gateway refuses is a clear error naming
the field, exit 1, with nothing left on the nodes."""

from __future__ import annotations

import subprocess
import sys

from pdserve.v1 import gateway_pb2

from tests.e2e.conftest import generate, wait_idle

PROMPT = "The cat sat on the mat. The cat sat on the mat. The cat"


def _client(cluster, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.client", PROMPT, "--address", cluster.address,
                           "--max-tokens", "12", "--timeout", "60", *flags],
                          capture_output=True, text=True, timeout=120)


def test_penalties_from_the_cli_give_what_generate_gives(cluster, stub) -> None:
    done = _client(cluster, "--temperature", "0", "--repetition-penalty", "1.5", "--frequency-penalty", "0.5")
    assert done.returncode == 0, done.stderr
    _, text, _ = generate(stub, prompt=PROMPT, sampling=gateway_pb2.SamplingParams(
        max_tokens=12, temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5))
    _, plain, _ = generate(stub, prompt=PROMPT, sampling=gateway_pb2.SamplingParams(max_tokens=12, temperature=0.0))
    assert done.stdout == text and text != plain  # the penalties changed the text, and the CLI sent them
    assert "[length: " in done.stderr


def test_a_value_the_gateway_refuses_names_the_field(cluster, stub) -> None:
    done = _client(cluster, "--repetition-penalty", "0")
    assert done.returncode == 1
    assert "error: INVALID_ARGUMENT:" in done.stderr and "repetition_penalty" in done.stderr
    wait_idle(stub)
