"""What every service's ``main()`` does, once: ``python -m services.<name>`` is a declaration of what differs.

:func:`run_service` parses the service's config (flags and ``PDSERVE_*`` variables; a bad one exits 2 with
argparse's usage line), configures logging, gRPC keepalive and tracing, runs ``serve(config)`` under uvloop
(``server.run``: a startup error is one ``error: …`` line and exit 1; SIGTERM/SIGINT drain, then exit 0)
and shuts tracing down after the drain, so the last requests' spans are exported.

:func:`serve_bound` is the tail shared by the services with one servicer: start the server, tell the
servicer its address and ``/metrics`` URL, log the ready line, serve until signalled (drain, stop).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

import structlog

from services.common.config import build_config
from services.common.keepalive import set_keepalive
from services.common.logging import setup_logging
from services.common.server import NodeServer, ignore_sigint_if_launched, run
from services.common.server_config import ServerConfig
from services.common.tls.channels import set_identity
from services.common.tracing import setup_tracing, shutdown_tracing

log = structlog.get_logger(__name__)


C = TypeVar("C", bound=ServerConfig)  # a service's config: the settings every service has, and its own


def run_service(config_type: type[C], argv: Sequence[str] | None, *, module: str, tracing_name: str,
                serve: Callable[[C], Coroutine[Any, Any, None]], role: str,
                before_serve: Callable[[], None] | None = None) -> int:
    """``python -m <module>``: config → logging, keepalive, the cluster identity of ``role`` (``--mtls-dir``;
    none with ``--insecure``; a missing certificate is one ``error:`` line and exit 1), tracing
    (``tracing_name``: the service name its spans carry; off unless ``OTEL_TRACES_EXPORTER`` is set) →
    ``before_serve()`` → ``serve(config)`` until SIGTERM/SIGINT. Returns the exit code (0); failures exit
    through ``server.run``."""
    ignore_sigint_if_launched()
    config = build_config(config_type, argv, prog=f"python -m {module}")
    setup_logging(config.log_level, config.log_format)
    set_keepalive(config.keepalive_s, config.keepalive_timeout_s)
    try:
        set_identity(config.identity(role))
    except (OSError, ValueError) as error:
        sys.stderr.write(f"error: {error}\n")
        raise SystemExit(1) from None
    if config.insecure:
        log.warning("insecure: internal ports and calls are plaintext, without mTLS (development only)")
    setup_tracing(tracing_name)
    if before_serve is not None:
        before_serve()
    try:
        run(serve(config))
    finally:
        shutdown_tracing()  # after the drain: the last requests' spans are exported
    return 0


class BoundServicer(Protocol):
    """A servicer told where it is served once the server is bound (it reports both in its status)."""

    address: str
    metrics_url: str


async def serve_bound(server: NodeServer, servicer: BoundServicer, advertise: str, ready: str, *,
                      stop: Callable[[], Awaitable[None]] | None = None, **fields: Any) -> None:
    """Start ``server``, set ``servicer.address`` (``advertise`` or the bound address) and its
    ``metrics_url``, log ``ready`` (``address``, ``fields``, ``metrics``), serve until SIGTERM/SIGINT
    (drain, stop the server), then ``stop()`` what it served (not called when the server failed to start)."""
    await server.start()
    servicer.address = advertise or server.address
    servicer.metrics_url = server.metrics_url(servicer.address)
    log.info(ready, address=servicer.address, **fields, metrics=servicer.metrics_url)
    try:
        await server.serve_until_signalled()
    finally:
        if stop is not None:
            await stop()
