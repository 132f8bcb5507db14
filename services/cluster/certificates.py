"""The certificates of a local cluster: per-process ones from a CA the launcher holds, made on first start.

- No directory given (``make run``): a throwaway CA in a temporary directory, gone with the cluster.
- A directory with ``ca/ca.key`` (what ``tls.ca.make_cluster_dir`` writes; the tests' session CA): that CA
  signs the processes' certificates, so whoever holds a certificate of it can call the cluster's nodes.
- A directory without a CA key (certificates made elsewhere, one directory per role): used as it is.

Each process gets its own certificate (``DIR/<process name>/``, one role each); the launcher itself calls
the nodes as ``admin`` (health checks while they start).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.common.tls.ca import ClusterCA, make_cluster_dir
from services.common.tls.identity import Identity


@dataclass
class ClusterCertificates:
    root: Path  # where the processes' directories are
    ca: ClusterCA | None  # signs per-process certificates; None: use root's per-role directories

    @classmethod
    def prepare(cls, given: Path | None, scratch: Path) -> ClusterCertificates:
        """See the module docstring; ``scratch``: a directory that lives as long as the cluster."""
        if given is None:
            make_cluster_dir(scratch / "mtls", holders={})
            return cls(scratch / "mtls", ClusterCA.load(scratch / "mtls" / "ca"))
        if (given / "ca" / "ca.key").is_file():
            return cls(scratch / "mtls", ClusterCA.load(given / "ca"))
        return cls(given, None)

    def directory(self, name: str, role: str) -> Path:
        """The ``--mtls-dir`` of process ``name`` (e.g. ``decode-2``) of ``role``."""
        if self.ca is None:
            return self.root
        target = self.root / name
        if not (target / "tls.crt").is_file():
            self.ca.issue(target, (role,), name=name)
        return target

    def admin(self) -> Identity:
        """The launcher's own identity."""
        return Identity.load(self.directory("launcher", "admin"), "admin")
