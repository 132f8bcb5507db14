"""Identities of the test session's CA (``tests/conftest.py``): one per role, and certificates of another CA."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

from services.common.tls.ca import make_cluster_dir
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
