"""Helpers every tool-call parser shares: reading a call object out of JSON text, holding back text that may
begin a marker, releasing content with its outer whitespace trimmed, and ids of calls.

A parser's whole-output ``parse`` is its stream fed the whole text at once (:func:`collect`), so the two
never disagree: a streamed output, however it is split, gives the same content and calls.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Sequence
from typing import Any

from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall, StreamPiece, ToolStream

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"
_ALNUM = string.ascii_letters + string.digits


def call_from_object(obj: Any, keys: Sequence[str] = ("arguments", "parameters")) -> ParsedToolCall | None:
    """The call ``obj`` is — a JSON object with a string ``name`` and an object under the first of ``keys``
    it has — or None. The arguments come back as compact JSON text (``json.dumps``'s separators)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in keys:
        if key in obj:
            arguments = obj[key]
            if not isinstance(arguments, dict):
                return None
            return ParsedToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))
    return None


def decode_json(text: str, pos: int = 0) -> tuple[Any, int] | None:
    """The JSON value starting at ``text[pos:]`` after whitespace, and the index just past it; None when
    there is none (json.JSONDecoder.raw_decode, so text may follow the value)."""
    start = skip_space(text, pos)
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None


def skip_space(text: str, pos: int = 0) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def only_call(text: str) -> ParsedToolCall | None:
    """The call ``text`` is when it holds exactly one call object and whitespace around it."""
    found = decode_json(text)
    if found is None or skip_space(text, found[1]) != len(text):
        return None
    return call_from_object(found[0])


def held_prefix_len(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``: text that must be held
    back, for it may yet become the marker."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ContentEmitter:
    """Releases content with the output's outer whitespace trimmed, as ``parse`` strips it: leading
    whitespace is dropped, and a trailing run of whitespace is held until non-space content follows it
    (then it goes out with that content) or the output ends (then it is dropped)."""

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def emit(self, text: str) -> list[StreamPiece]:
        if not self._started:
            text = text.lstrip(_WHITESPACE)
            if not text:
                return []
            self._started = True
        text = self._held + text
        body = text.rstrip(_WHITESPACE)
        self._held = text[len(body):]
        return [StreamPiece(content=body)] if body else []


def collect(stream: ToolStream, text: str) -> ParsedOutput:
    """``text`` fed whole to ``stream``: its content joined, and its calls in order."""
    pieces = stream.feed(text) + stream.finish()
    content = "".join(piece.content for piece in pieces if piece.call is None)
    return ParsedOutput(content.strip(), tuple(piece.call for piece in pieces if piece.call is not None))


def hex_call_id() -> str:
    """``call_`` + 24 hex digits, as OpenAI's ids look."""
    return "call_" + secrets.token_hex(12)


def alnum_call_id(size: int = 9) -> str:
    """``size`` random letters and digits (Mistral's templates require 9)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(size))


def arguments_value(arguments: str) -> Any:
    """A call's arguments as a JSON value to embed in a rendered call: the object its text holds, or the
    text itself as a string when it is not JSON."""
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments
