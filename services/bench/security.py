"""Certificates for a benchmark that calls the nodes itself, as one of the cluster's processes would.

A benchmark process has no cluster identity of its own (``run_service`` sets one only in services). One that
plays a prefill node (streams KV into a decode node's grant) or a node of the cache-store needs a
certificate of that role from the CA the nodes trust: :func:`bench_ca` makes a throwaway CA with one holder
directory per role (``tls.ca.make_cluster_dir``), and :class:`BenchCA` gives the nodes' flags
(``--mtls-dir DIR/<role>``, or ``--insecure``) and the identities to call them with. A cluster started with
``ClusterSpec(mtls_dir=ca.root)`` issues its processes' certificates from the same CA (``cluster.certificates``).

:func:`acting_as` sets the process identity (``tls.channels.set_identity``) for code that opens its channels
itself (the cache-store client, the KV IPC links) and restores the previous one after.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from services.common.tls.ca import make_cluster_dir
from services.common.tls.channels import current_identity, set_identity
from services.common.tls.identity import Identity


@dataclass(frozen=True)
class BenchCA:
    root: Path | None  # the CA and one directory per role; None: plaintext (every node --insecure)

    def node_args(self, role: str) -> tuple[str, ...]:
        """The flags of a node of ``role`` started by the benchmark."""
        return ("--insecure",) if self.root is None else ("--mtls-dir", str(self.root / role))

    def identity(self, role: str) -> Identity | None:
        """A certificate of ``role`` to call the nodes with (None: plaintext)."""
        return None if self.root is None else Identity(self.root / role)


@contextmanager
def bench_ca(insecure: bool = False) -> Iterator[BenchCA]:
    """A throwaway CA (gone on exit), or none with ``insecure``."""
    if insecure:
        yield BenchCA(None)
        return
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-mtls-") as tmp:
        make_cluster_dir(Path(tmp))
        yield BenchCA(Path(tmp))


@contextmanager
def acting_as(identity: Identity | None) -> Iterator[None]:
    """This process calls with ``identity`` (None: plaintext) until the block ends."""
    previous = current_identity()
    set_identity(identity)
    try:
        yield
    finally:
        set_identity(previous)
