"""structlog setup shared by the services: JSON lines by default, human-readable on a terminal.

Call ``setup_logging`` once in ``main.py``; elsewhere ``structlog.get_logger(__name__)``. The
standard library's loggers (grpc, asyncio) go to the same stream at the same level.

Every line of a request's life carries ``request_id``: servicers bind it to their task's context
(``tracing.server_span`` / ``tracing.bind_request``, merged here by ``merge_contextvars``), and code on
the engine thread passes ``request_id=`` explicitly. When tracing is on, ``trace_id`` and ``span_id`` of
the current span are added too (``tracing.add_trace_ids``). Services never ``print()``.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from services.common.tracing import add_trace_ids

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("auto", "json", "console")


def setup_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog and stdlib logging. ``fmt="auto"``: console if ``stream`` is a TTY, else JSON."""
    stream = stream or sys.stderr
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    numeric = logging.getLevelName(level.upper())
    console = fmt == "console" or (fmt == "auto" and stream.isatty())
    # The console renderer formats exceptions itself; JSON gets them as structured tracebacks.
    tail: list[structlog.typing.Processor] = (
        [structlog.dev.ConsoleRenderer()] if console
        else [structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False)),
           structlog.processors.JSONRenderer()]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            *tail,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # one write per line (message and newline together): print() writes them apart, and a line another
        # thread logs through the stdlib handler could land between them
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, stream=stream, format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        force=True)
