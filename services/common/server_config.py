"""The settings every service has (``ServerConfig``; a service's config dataclass extends it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.common import keepalive
from services.common.config import setting
from services.common.logging import FORMATS, LEVELS
from services.common.tls.identity import Identity

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
"""KV messages are 1–4 MiB of payload plus framing; a block of a large model may exceed 4 MiB alone."""


@dataclass(frozen=True)
class ServerConfig:
    """Settings every service has; a service's config dataclass extends this one."""

    listen: str = setting("127.0.0.1:0", "host:port to serve on; port 0 = ephemeral")
    port_file: Path | None = setting(None, "write the bound port here once serving")  # noqa: RUF009 (a field())
    grace_s: float = setting(5.0, "seconds in-flight calls get after the drain")
    drain_timeout_s: float = setting(30.0, "longest the drain hook may run")
    max_message_mib: int = setting(DEFAULT_MAX_MESSAGE_BYTES >> 20, "gRPC message size limit")
    log_level: str = setting("info", "debug, info, warning, error")
    log_format: str = setting("auto", "auto (console on a TTY, else json), json, console")
    advertise: str = setting("", "address other processes reach this one at (default: the bound address)")
    keepalive_s: float = setting(10.0, "ping peers that have calls in flight this often; 0 = never")
    keepalive_timeout_s: float = setting(5.0, "a peer that does not answer a ping within this fails its calls "
                                              "UNAVAILABLE (a hung node)")
    metrics_listen: str = setting("127.0.0.1:0", "host:port of the Prometheus /metrics HTTP endpoint; "
                                                 "port 0 = ephemeral, empty = none")
    mtls_dir: Path | None = setting(None, "cluster certificates (mTLS of every internal port and call): a "  # noqa: RUF009
                                          "directory with ca.crt, tls.crt, tls.key (a cert-manager Secret), or "
                                          "one with such a directory per role; required unless --insecure")
    insecure: bool = setting(False, "internal ports and calls in plaintext, without mTLS (development only)")
    health_listen: str = setting("", "host:port of a plaintext port serving only grpc.health.v1 (Kubernetes "
                                     "probes cannot present certificates); empty = none")

    def __post_init__(self) -> None:
        check_host_port("listen", self.listen)
        if self.max_message_mib < 1:
            raise ValueError(f"max_message_mib must be >= 1, got {self.max_message_mib}")
        if self.grace_s < 0 or self.drain_timeout_s < 0:
            raise ValueError("grace_s and drain_timeout_s must be >= 0")
        if self.log_level.lower() not in LEVELS:
            raise ValueError(f"log_level must be one of {LEVELS}, got {self.log_level!r}")
        if self.log_format not in FORMATS:
            raise ValueError(f"log_format must be one of {FORMATS}, got {self.log_format!r}")
        keepalive.Keepalive(self.keepalive_s, self.keepalive_timeout_s)  # raises naming both when out of range
        if self.metrics_listen:
            check_host_port("metrics_listen", self.metrics_listen, "host:port or empty")
        if self.health_listen:
            check_host_port("health_listen", self.health_listen, "host:port or empty")

    def identity(self, role: str) -> Identity | None:
        """This process's cluster identity (None with ``insecure``); ``ValueError`` when mTLS has no
        certificates to use."""
        if self.insecure:
            return None
        if self.mtls_dir is None:
            raise ValueError("internal mTLS needs certificates: --mtls-dir DIR (ca.crt, tls.crt, tls.key, or a "
                             "directory of them per role; `python -m services.cluster` makes a throwaway set), "
                             "or --insecure for plaintext (development only)")
        return Identity.load(self.mtls_dir, role)


def check_host_port(name: str, value: str, expected: str = "host:port") -> None:
    """``value`` is ``host:port`` with a port in 0..65535 (0: ephemeral), else ``ValueError`` naming ``name``."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    if int(port) > 65535:
        raise ValueError(f"{name}: port must be 0-65535, got {port}")
