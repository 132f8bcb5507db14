"""Start a service as a child process on an ephemeral loopback port and stop it cleanly.

Used by tests and by ``make run``::

    with launch("services.cache_store", "--capacity-bytes", "1000000") as node:
        channel = grpc.insecure_channel(node.address)

On exit the process gets SIGTERM (graceful drain) and, if it has not exited after ``stop_timeout_s``,
SIGKILL: no process outlives the ``with`` block.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from services.common.ports import PortTaken, StartupError, port_is_free, wait_for_port_file, wait_until_serving
from services.common.server import IGNORE_SIGINT
from services.common.tls.identity import Identity

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLE_OF_MODULE = {"services.prefill_node": "prefill", "services.decode_node": "decode",
                  "services.cache_store": "cache-store"}


@dataclass
class ServiceProcess:
    module: str
    process: subprocess.Popen[bytes]
    address: str
    port_file: Path | None = None
    host: str = "127.0.0.1"
    identity: Identity | bool | None = True  # how to call it: True = this process's identity; None = plaintext
    given_role: str = ""  # its role where the module is none of ROLE_OF_MODULE's (a test's wrapper of a node)
    terminated: bool = False  # SIGTERM was sent
    given_port: int = 0  # the port it was told to bind (its address is known before it serves); 0: ephemeral

    @property
    def role(self) -> str:
        """Its role in the cluster (its certificate's); empty for the gateway, whose port is public."""
        return self.given_role or ROLE_OF_MODULE.get(self.module, "")

    def wait_serving(self, timeout_s: float) -> str:
        """Wait for the port file and a SERVING health check; returns (and sets) the address. Raises
        :class:`PortTaken` when it exited before serving on a ``given_port`` someone else holds now."""
        if self.port_file is not None:
            try:
                port = wait_for_port_file(self.port_file, timeout_s, self.process)
            except StartupError as error:
                if self.given_port and self.process.poll() is not None and not port_is_free(self.host,
                                                                                             self.given_port):
                    raise PortTaken(f"{self.module} could not bind {self.address}: another process took it "
                                    f"({error})") from None
                raise
            self.address = f"{self.host}:{port}"
        else:
            assert self.address, "no port file to read"
        role = self.role if self.identity is not None else ""
        wait_until_serving(self.address, timeout_s=timeout_s, role=role, identity=self.identity)
        return self.address

    def terminate(self) -> None:
        """Ask for a graceful drain: SIGTERM, once (a service takes a second signal as "stop without grace"),
        without waiting, so that several processes drain at the same time."""
        if not self.terminated and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.terminated = True

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM (unless :meth:`terminate` sent it), wait up to ``timeout_s``, then SIGKILL. Returns the exit
        code."""
        if self.process.poll() is None:
            self.terminate()
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@contextmanager
def launch(
    module: str,
    *args: str,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    startup_timeout_s: float = 20.0,
    stop_timeout_s: float = 10.0,
    stdout: int | None = None,
    stderr: int | None = None,
    wait: bool = True,
    identity: Identity | bool | None = True,
    role: str = "",
    port: int = 0,
) -> Iterator[ServiceProcess]:
    """Run ``python -m module --listen host:PORT --port-file … *args``; yields once it is SERVING (at once
    with ``wait=False``: call ``node.wait_serving()`` later, so several processes can start together).
    ``port`` 0 binds an ephemeral port, whose address is known once it serves; a given one
    (``ports.unused_port``) makes ``node.address`` known at once, for peers started beside it.
    ``cwd`` runs the module from another checkout (``python -m`` imports from the working directory first).
    ``identity``: how this process calls it (health checks): True = this process's (``tls.channels``), None
    = plaintext (also when ``--insecure`` is among ``args``). ``role``: the process's cluster role, for a module
    that is none of ``ROLE_OF_MODULE``'s (a test's wrapper around a node's main)."""
    with tempfile.TemporaryDirectory(prefix="pdserve-launch-") as tmp:
        port_file = Path(tmp) / "port"
        command = [sys.executable, "-m", module, "--listen", f"{host}:{port}", "--port-file", str(port_file),
                   *args]
        # IGNORE_SIGINT: a terminal's Ctrl-C (SIGINT to its whole foreground group) is for the launcher, which
        # stops its services in order with one SIGTERM each; a SIGINT of their own would be a second signal,
        # which cuts a drain short (SIGTERM from elsewhere, a timeout's, still stops them)
        process = subprocess.Popen(command, cwd=cwd or REPO_ROOT,
                                   env={**os.environ, IGNORE_SIGINT: "1", **(env or {})}, stdout=stdout, stderr=stderr)
        plain = "--insecure" in args or (env or {}).get("PDSERVE_INSECURE", "").lower() in ("1", "true", "yes")
        node = ServiceProcess(module, process, address=f"{host}:{port}" if port else "", port_file=port_file,
                              host=host, identity=None if plain else identity, given_role=role, given_port=port)
        try:
            if wait:
                node.wait_serving(startup_timeout_s)
            yield node
        finally:
            node.stop(stop_timeout_s)
