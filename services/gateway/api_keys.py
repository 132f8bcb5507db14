"""The gateway's API keys: the set a caller's ``Bearer`` key is checked against, in constant time.

Keys come from ``--api-key`` (comma-separated) and/or ``--api-key-file`` (one key per line; blank lines and
``#`` comments ignored). The file is looked at again on use, at most once a second, and re-read when its
modification time or size changed, so a rotated key takes effect without a restart (a file that cannot be
read then keeps the keys it had, with a warning). No key and no file: the gateway is open (``enabled`` is
False). A file with no key in it refuses everyone.

A key is never logged and never put in an error message: the answers say only *missing* or *invalid*.
"""

from __future__ import annotations

import hmac
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

MISSING = "missing"
INVALID = "invalid"
RECHECK_S = 1.0


def split_keys(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` → ``("a", "b", "c")``."""
    return tuple(key.strip() for key in text.split(",") if key.strip())


def parse_key_file(text: str) -> tuple[str, ...]:
    """One key per line; blank lines and lines starting with ``#`` are skipped."""
    lines = (line.strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def bearer(header: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` value (scheme case-insensitive); None without one."""
    if not header:
        return None
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


class ApiKeys:
    """The configured keys. ``check(key)`` → None (accepted), ``MISSING`` or ``INVALID``."""

    def __init__(self, keys: tuple[str, ...] = (), key_file: Path | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``key_file`` is read now: ``ValueError`` (naming the path, not the contents) if it cannot be."""
        self._fixed = tuple(k.encode() for k in keys)
        self._file = key_file
        self._clock = clock
        self._lock = threading.Lock()
        self._from_file: tuple[bytes, ...] = ()
        self._stamp: tuple[int, int] | None = None
        self._next_check = 0.0
        if key_file is not None:
            try:
                self._load(os.stat(key_file))
            except OSError as error:
                raise ValueError(f"api_key_file: cannot read {key_file}: {error.strerror}") from None

    @property
    def enabled(self) -> bool:
        """Keys are required (a key or a key file is configured)."""
        return bool(self._fixed) or self._file is not None

    def check(self, key: str | None) -> str | None:
        """None when ``key`` is one of the keys (or none are required); else ``MISSING`` or ``INVALID``.
        Every configured key is compared, each in constant time."""
        if not self.enabled:
            return None
        if not key:
            return MISSING
        presented = key.encode()
        matched = False
        for known in (*self._fixed, *self._current_file_keys()):
            matched |= hmac.compare_digest(presented, known)
        return None if matched else INVALID

    def _current_file_keys(self) -> tuple[bytes, ...]:
        if self._file is None:
            return ()
        now = self._clock()
        if now >= self._next_check:
            with self._lock:
                if now >= self._next_check:
                    self._next_check = now + RECHECK_S
                    self._reload_if_changed()
        return self._from_file

    def _reload_if_changed(self) -> None:
        assert self._file is not None
        try:
            stat = os.stat(self._file)
            if (stat.st_mtime_ns, stat.st_size) != self._stamp:
                self._load(stat)
                log.info("API key file reloaded", path=str(self._file), keys=len(self._from_file))
        except OSError as error:
            log.warning("API key file unreadable: keeping the keys it had", path=str(self._file),
                        error=error.strerror)

    def _load(self, stat: os.stat_result) -> None:
        assert self._file is not None
        text = self._file.read_text(encoding="utf-8", errors="replace")
        self._from_file = tuple(k.encode() for k in parse_key_file(text))
        self._stamp = (stat.st_mtime_ns, stat.st_size)
