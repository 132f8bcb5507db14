"""Identities of the test session's CA (``tests/conftest.py``): one per role, and certificates of another CA."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from services.common.tls.ca import ClusterCA, make_cluster_dir
from services.common.tls.channels import current_identity, set_identity
from services.common.tls.identity import Identity


def session_root() -> Path:
    return Path(os.environ["PDSERVE_MTLS_DIR"])


@functools.cache
def identity_of(role: str) -> Identity:
    """A certificate of the session CA holding only ``role``."""
    return Identity(session_root() / role)


@functools.cache
def foreign_identity(role: str) -> Identity:
    """A certificate naming ``role`` but signed by another CA (what an attacker could make)."""
    root = Path(tempfile.mkdtemp(prefix="pdserve-foreign-ca-"))
    make_cluster_dir(root)
    return Identity(root / role)


@contextlib.contextmanager
def own_rotatable_identity(directory: Path, role: str) -> Iterator[tuple[ClusterCA, Path]]:
    """This process holds a certificate of ``role`` in ``directory`` (issued by the session CA; re-issue it
    with ``ca.issue(directory, (role,))`` to rotate it); the previous identity is restored afterwards.
    Set ``services.common.tls.identity.RECHECK_S`` to 0 to see a rotation at once."""
    ca = ClusterCA.load(session_root() / "ca")
    ca.issue(directory, (role,))
    previous = current_identity()
    set_identity(Identity(directory))
    try:
        yield ca, directory
    finally:
        set_identity(previous)
