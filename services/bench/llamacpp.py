"""llama.cpp's OpenAI-compatible servers as benchmark baselines, on an ephemeral loopback port.

- llama-cpp-python's server (``python -m llama_cpp.server``), run from its own virtual environment
  (``make llamacpp`` builds ``.venv-llamacpp``). It holds one ``Llama`` context behind a lock: it runs
  one request at a time (no batching; it queues the others) and, between consecutive requests, reuses
  the KV of the longest common prefix with the previous prompt. By default it cuts a streaming request
  short as soon as another one waits (``interrupt_requests``); that is turned off here, so every request
  runs to its end.
- llama.cpp's own ``llama-server`` (C++, ``make llama-server`` builds it from the same pinned llama.cpp
  sources into ``.venv-llamacpp/bin``): ``--parallel`` slots with continuous batching, so it batches
  concurrent requests as pdserve does. ``n_ctx`` is shared by the slots.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.common.launch import REPO_ROOT
from services.common.ports import free_port

DEFAULT_VENV = REPO_ROOT / ".venv-llamacpp"
DEFAULT_LLAMA_SERVER = DEFAULT_VENV / "bin" / "llama-server"


class LlamaCppUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class LlamaCppServer:
    url: str
    process: subprocess.Popen[bytes]


def python_of(venv: Path = DEFAULT_VENV) -> Path:
    python = venv / "bin" / "python"
    if not python.is_file():
        raise LlamaCppUnavailable(f"{python} is missing: run `make llamacpp` to build llama-cpp-python[server]")
    return python


@contextlib.contextmanager
def start_llamacpp(model: Path, threads: int = 2, n_ctx: int = 4096, venv: Path = DEFAULT_VENV,
                   extra_args: Sequence[str] = (), startup_timeout_s: float = 120.0,
                   stderr: int | None = subprocess.DEVNULL) -> Iterator[LlamaCppServer]:
    """llama-cpp-python's server on ``model`` until the block ends (SIGTERM, then SIGKILL)."""
    port = free_port()
    command = [str(python_of(venv)), "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
               "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
               "--n_ctx", str(n_ctx), "--interrupt_requests", "False", "--verbose", "False", *extra_args]
    with _serve(command, port, startup_timeout_s, stderr) as server:
        yield server


@contextlib.contextmanager
def start_llama_server(model: Path, threads: int = 2, parallel: int = 16, n_ctx: int = 32768,
                       binary: Path = DEFAULT_LLAMA_SERVER, extra_args: Sequence[str] = (),
                       startup_timeout_s: float = 120.0,
                       stderr: int | None = subprocess.DEVNULL) -> Iterator[LlamaCppServer]:
    """llama.cpp's ``llama-server`` on ``model``, ``parallel`` slots of ``n_ctx / parallel`` tokens each."""
    if not binary.is_file():
        raise LlamaCppUnavailable(f"{binary} is missing: run `make llama-server` to build it")
    port = free_port()
    command = [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--threads", str(threads), "--threads-batch", str(threads), "--ctx-size", str(n_ctx),
               "--parallel", str(parallel), "--cont-batching", "--no-webui", *extra_args]
    with _serve(command, port, startup_timeout_s, stderr) as server:
        yield server


@contextlib.contextmanager
def _serve(command: list[str], port: int, startup_timeout_s: float,
           stderr: int | None) -> Iterator[LlamaCppServer]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, startup_timeout_s)
        yield LlamaCppServer(url, process)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LlamaCppUnavailable(f"{process.args[0]} exited with code {process.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise LlamaCppUnavailable(f"{process.args[0]} did not answer on {url} within {timeout_s} s")
