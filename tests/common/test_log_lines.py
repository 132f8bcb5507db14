"""Log lines stay whole when several threads log at once: structlog writes each line with its newline in one
write (``print`` wrote them apart, and a line the stdlib handler wrote from another thread could land between
them: a JSON line and a grpc debug line then shared one line of a service's stderr)."""

from __future__ import annotations

import io
import json
import logging
import threading

import structlog

from services.common.logging import setup_logging


class WriteRecorder(io.StringIO):
    """A stream that keeps each ``write`` call's text."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_each_line_is_one_write_and_threads_never_share_a_line():
    stream, root = WriteRecorder(), logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers.clear()  # setup_logging's basicConfig(force=True) would close them (pytest's own among them)
    setup_logging("info", "json", stream)
    try:
        log, stdlib = structlog.get_logger("lines"), logging.getLogger("grpc.lines")

        def structured() -> None:
            for i in range(300):
                log.info("node healthy", i=i)

        def plain() -> None:
            for i in range(300):
                stdlib.info("Loaded running loop %d", i)

        threads = [threading.Thread(target=structured), threading.Thread(target=plain)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        structlog.reset_defaults()
        root.handlers[:] = saved_handlers  # ours dropped, pytest's back, at the level they had
        root.setLevel(saved_level)
    assert all(text.endswith("\n") and text.count("\n") == 1 for text in stream.writes), stream.writes[:4]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 600
    assert sum(1 for line in lines if line.startswith("{") and json.loads(line)["event"] == "node healthy") == 300
