"""A process's certificate, its key and the CA it trusts, read from files and re-read when they change.

The files are cert-manager's Secret shape: ``ca.crt``, ``tls.crt``, ``tls.key`` in one directory. The
setting ``--mtls-dir`` names that directory, or a directory holding one such directory per role (what
``services.cluster`` and the tests create): a decode node then reads ``DIR/decode``.

Rotation needs no restart. A server's credentials are gRPC's dynamic SSL credentials, whose fetcher runs
at each new handshake and hands over the files' new contents once they changed (mtime, checked at most
every ``RECHECK_S``); connections already open keep the certificate they began with. A client opens new
channels with the current files: ``generation`` counts the changes, so a pool can replace its channels.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

from services.common.tls.ca import CA_FILE, CERT_FILE, KEY_FILE, ROLES, SPIFFE_PREFIX
from services.common.tls.reloading import following_credentials

RECHECK_S = 1.0


@dataclass(frozen=True)
class KeyPair:
    """The bytes of one reading of the three files."""

    ca: bytes
    cert: bytes
    key: bytes


def resolve_dir(directory: Path, role: str) -> Path:
    """``directory`` when it holds a certificate, else ``directory/role``; ``ValueError`` naming what is
    missing."""
    for candidate in (directory, directory / role):
        if (candidate / CERT_FILE).is_file():
            missing = [f for f in (CA_FILE, KEY_FILE) if not (candidate / f).is_file()]
            if missing:
                raise ValueError(f"mtls_dir: {candidate} has {CERT_FILE} but not {', '.join(missing)}")
            return candidate
    raise ValueError(f"mtls_dir: neither {directory} nor {directory / role} holds {CERT_FILE} "
                     f"(cert-manager's ca.crt, tls.crt, tls.key)")


def roles_of_cert(cert_pem: bytes) -> frozenset[str]:
    """The pdserve roles a certificate names (its ``spiffe://pdserve/<role>`` URI SANs)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    return frozenset(u.removeprefix(SPIFFE_PREFIX) for u in uris
                     if u.startswith(SPIFFE_PREFIX) and u.removeprefix(SPIFFE_PREFIX) in ROLES)


class Identity:
    """This process's place in the cluster, from a directory of cert-manager-shaped files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._pair = self._read()
        self._checked = time.monotonic()
        self.generation = 0
        self.roles = roles_of_cert(self._pair.cert)
        if not self.roles:
            raise ValueError(f"mtls_dir: {directory / CERT_FILE} names no pdserve role "
                             f"(a URI SAN {SPIFFE_PREFIX}<role>, role one of {ROLES})")

    @classmethod
    def load(cls, directory: Path, role: str) -> Identity:
        """The identity of a process of ``role`` under ``--mtls-dir directory`` (see :func:`resolve_dir`)."""
        return cls(resolve_dir(directory, role))

    def current(self) -> KeyPair:
        """The files' contents, re-read when they changed (checked at most every ``RECHECK_S``)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= RECHECK_S:
                self._checked = now
                try:
                    stamp = self._file_stamp()
                except OSError:  # a file missing mid-rotation: keep the last good pair, look again later
                    return self._pair
                if stamp != self._stamp:
                    self._reload(stamp)
            return self._pair

    def _reload(self, stamp: tuple[float, ...]) -> None:
        try:
            pair = self._read()
            roles = roles_of_cert(pair.cert)
        except (OSError, ValueError):
            return  # half-written or unreadable: keep the last good files, look again later
        if roles:
            self._pair, self._stamp, self.roles = pair, stamp, roles
            self.generation += 1

    def server_credentials(self, require_client_auth: bool = True) -> grpc.ServerCredentials:
        """Credentials for a server port that present the current certificate and (by default) accept only
        clients whose certificate the CA signed; new files take effect at the next handshake."""
        return following_credentials(self.current, lambda pair: _configuration(pair, require_client_auth),
                                     require_client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for a new channel: the CA to verify servers with and the certificate to present."""
        pair = self.current()
        return grpc.ssl_channel_credentials(pair.ca, pair.key, pair.cert)

    def _file_stamp(self) -> tuple[float, ...]:
        return tuple((self.directory / f).stat().st_mtime_ns for f in (CA_FILE, CERT_FILE, KEY_FILE))

    def _read(self) -> KeyPair:
        return KeyPair(*((self.directory / f).read_bytes() for f in (CA_FILE, CERT_FILE, KEY_FILE)))


def _configuration(pair: KeyPair, with_ca: bool) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(pair.key, pair.cert)],
                                                     root_certificates=pair.ca if with_ca else None)
