"""Text that may be the start of a marker, held back while a stream is read (shared by every reasoning parser).

A streamed output arrives in pieces that may cut a marker (``"</th"`` then ``"ink>"``): a reader releases
the text that cannot belong to a marker and keeps the rest until the next piece (or the end) says which it is.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


def held_back_length(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is the start of ``marker`` (and not all of it)."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


@dataclass(frozen=True)
class Scan:
    """``released``: text known not to hold the marker; ``found``: the marker was seen, and ``after`` is the
    text that follows it (then nothing is held back)."""

    released: str
    found: bool = False
    after: str = ""


class MarkerScanner:
    """Reads pieces of text until ``marker``; what may start it is held back."""

    def __init__(self, marker: str):
        self.marker = marker
        self._held = ""

    def feed(self, text: str) -> Scan:
        text = self._held + text
        before, found, after = text.partition(self.marker)
        if found:
            self._held = ""
            return Scan(before, True, after)
        keep = held_back_length(text, self.marker)
        self._held = text[len(text) - keep:]
        return Scan(text[:len(text) - keep])

    def finish(self) -> str:
        """The output ended without the marker: the held-back text is plain text."""
        held, self._held = self._held, ""
        return held


def strip_leading_newlines(text: str) -> str:
    """The answer after the end of thinking starts at its first character that is not a line break."""
    return text.lstrip("\r\n")
