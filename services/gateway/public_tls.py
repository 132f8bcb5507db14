"""TLS of the gateway's public ports (``--tls-cert``, ``--tls-key``): one certificate for gRPC and HTTPS,
re-read when its files change.

Server-only TLS: the gateway presents its certificate, callers present none (they authenticate with API
keys). Unlike the cluster's ``Identity`` there is no CA to trust and no role in the certificate: any
certificate the clients trust will do (a public CA's, cert-manager's, a private one).

Rotation needs no restart. Both ports look at the files at each new handshake, at most every
``RECHECK_S`` (their mtimes): gRPC through its dynamic SSL credentials, whose fetcher hands over the new
pair; HTTPS through the ``SSLContext``'s SNI callback (called at every handshake, with or without SNI),
which moves the connection to a context holding the new pair. Connections already open keep the
certificate they began with. A pair that does not load (a key that is not the certificate's: the two files
were caught between their writes), or a file briefly missing (replaced by delete-then-write), is not taken:
the last good one stays until the files agree.
"""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from services.common.tls.reloading import following_credentials

log = structlog.get_logger(__name__)

RECHECK_S = 1.0


@dataclass(frozen=True)
class _Loaded:
    """One good reading of the two files: their bytes (gRPC) and a context holding them (HTTPS)."""

    cert: bytes
    key: bytes
    context: ssl.SSLContext
    stamp: tuple[int, int]


class PublicTls:
    """The gateway's public certificate and key, from two PEM files."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        """``ValueError`` naming the files when they cannot be read or do not belong together."""
        self.cert_file = cert_file
        self.key_file = key_file
        self._lock = threading.Lock()  # gRPC's fetcher runs on gRPC's threads, HTTPS's callback on the loop
        try:
            self._loaded = self._load()
        except (OSError, ssl.SSLError, ValueError) as error:
            raise ValueError(f"tls_cert/tls_key: cannot load {cert_file} and {key_file}: {error}") from None
        self._checked = time.monotonic()
        self._unreadable = False  # the files could not be stat()ed at the last check (warned once)
        self.generation = 0  # counts the pairs taken after the first
        self._entry = self._loaded.context
        self._entry.sni_callback = self._on_handshake

    def current(self) -> _Loaded:
        """The last good pair, the files re-read first when their mtime changed (checked at most every
        ``RECHECK_S``)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= RECHECK_S:
                self._checked = now
                try:
                    stamp = self._stamp()
                except OSError as error:  # a file briefly gone mid-rotation: keep the last good pair
                    if not self._unreadable:  # warned once per outage, not at every handshake
                        self._unreadable = True
                        log.warning("public TLS files cannot be read; keeping the previous certificate",
                                    cert=str(self.cert_file), key=str(self.key_file), error=str(error))
                    return self._loaded
                if self._unreadable:
                    self._unreadable = False
                    log.info("public TLS files readable again", cert=str(self.cert_file))
                if stamp != self._loaded.stamp:
                    self._reload()
            return self._loaded

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials presenting the current pair; no client certificate asked for."""
        return following_credentials(
            self.current, lambda loaded: grpc.ssl_server_certificate_configuration([(loaded.key, loaded.cert)]),
            require_client_auth=False)

    def ssl_context(self) -> ssl.SSLContext:
        """The context to serve HTTPS with: each handshake is moved onto the current pair's context."""
        return self._entry

    def _on_handshake(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                      context: ssl.SSLContext) -> None:
        current = self.current().context
        if connection.context is not current:
            connection.context = current

    def _reload(self) -> None:
        try:
            loaded = self._load()
        except (OSError, ssl.SSLError, ValueError) as error:  # caught mid-rotation: keep the last good pair
            log.warning("public TLS files changed but do not load; keeping the previous certificate",
                        cert=str(self.cert_file), error=str(error))
            return
        self._loaded = loaded
        self.generation += 1
        log.info("public TLS certificate reloaded", cert=str(self.cert_file), generation=self.generation)

    def _load(self) -> _Loaded:
        stamp = self._stamp()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)  # OpenSSL checks that the key is the cert's
        cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
        if self._stamp() != stamp:
            raise ValueError("the files changed while being read")
        return _Loaded(cert, key, context, stamp)

    def _stamp(self) -> tuple[int, int]:
        return self.cert_file.stat().st_mtime_ns, self.key_file.stat().st_mtime_ns
