"""A service that cannot start says why in one line (exit code 1), not with a Python traceback: a port in
use, a model file that cannot be read, a setting the engine refuses. Real processes."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def start(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120)


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("argv", [
    ("services.cache_store", "--listen", "127.0.0.1:{port}"),
    ("services.cache_store", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:{port}"),
    ("services.gateway", "--prefill", "127.0.0.1:1", "--decode", "127.0.0.1:2", "--listen", "127.0.0.1:0",
     "--http-listen", "127.0.0.1:{port}"),
])
def test_a_port_in_use_is_one_line(busy_port, argv):
    done = start(*(arg.format(port=busy_port) for arg in argv))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("error: cannot bind")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (("--model", "/nonexistent.gguf"), "error: /nonexistent.gguf: expected a .gguf file"),
    (("--model", "/etc"), "error: /etc: expected a .gguf file"),
])
def test_a_model_node_that_cannot_load_its_model_is_one_line(argv, message):
    done = start("services.decode_node", "--listen", "127.0.0.1:0", "--metrics-listen", "", *argv)
    assert done.returncode == 1 and done.stderr.splitlines()[-1].startswith(message), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_a_disk_dir_that_cannot_be_used_is_one_line_naming_the_flag(tmp_path):
    """A directory nobody may write (sysfs refuses even root) failed no put: every block it should have
    kept was dropped, one warning at a time, while the store reported healthy."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [("/sys/kernel", "error: --disk-dir: the disk tier's directory /sys/kernel cannot be written: [Errno "),
             (str(a_file), f"error: --disk-dir: [Errno 17] File exists: '{a_file}'")]
    for disk_dir, message in cases:
        done = start("services.cache_store", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--disk-dir", disk_dir)
        assert done.returncode == 1 and done.stderr.splitlines()[-1].startswith(message), done.stderr[-2000:]
        assert "Traceback" not in done.stderr
