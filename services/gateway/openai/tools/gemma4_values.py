"""Gemma 4's argument values, as its chat template writes them (``format_argument``) and its parsers read them back
(vLLM's ``gemma4`` tool parser, llama.cpp's Gemma 4 grammar)::

    call:get_weather{city:<|"|>Paris<|"|>,days:3,units:{metric:true},tags:[<|"|>a<|"|>,None]}

A string between ``<|"|>`` markers, raw (no escapes: quotes, braces, commas and line breaks stand as they are); a
number bare (``42``, ``2.5``, ``1e-05``); ``true`` and ``false``; null as the template prints it, ``None`` (``null``,
``none`` and ``nil`` read too); an object ``{key:value,…}`` with bare keys, in Jinja's ``dictsort`` order (case
aside); a list ``[value,…]``. No whitespace is written; a reader skips it around keys, values and separators. A bare
word that is none of these reads as a string, an empty value as ``""`` (as vLLM's).
"""

from __future__ import annotations

import json
import re
from typing import Any

QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NULLS = ("null", "none", "nil")
_BARE_END = ",}]"


class _Malformed(ValueError):
    pass


def read_arguments(text: str) -> dict[str, Any] | None:
    """The object ``{…}`` that is the whole of ``text`` (surrounding whitespace aside), or None when it is not one."""
    reader = _Reader(text)
    try:
        reader.skip_space()
        if not reader.at("{"):
            return None
        value = reader.object()
        reader.skip_space()
    except _Malformed:
        return None
    return value if reader.pos == len(text) else None


def render_value(value: Any) -> str:
    """``value`` (JSON's) as the template writes it."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{render_value(value[key])}" for key in sort_keys(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render_value(item) for item in value) + "]"
    return json.dumps(value)


def sort_keys(keys: Any) -> list[str]:
    """An object's keys in the order the template writes them: Jinja's ``dictsort``, which ignores case."""
    return sorted(keys, key=str.lower)


class _Reader:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def at(self, token: str) -> bool:
        return self.text.startswith(token, self.pos)

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def expect(self, token: str) -> None:
        self.skip_space()
        if not self.at(token):
            raise _Malformed(token)
        self.pos += len(token)

    def value(self) -> Any:
        self.skip_space()
        if self.at(QUOTE):
            end = self.text.find(QUOTE, self.pos + len(QUOTE))
            if end < 0:
                raise _Malformed("an unclosed string")
            start, self.pos = self.pos + len(QUOTE), end + len(QUOTE)
            return self.text[start:end]
        if self.at("{"):
            return self.object()
        if self.at("["):
            return self.array()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in _BARE_END:
            self.pos += 1
        return _bare(self.text[start:self.pos].strip())

    def object(self) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        self.skip_space()
        if self.at("}"):
            self.pos += 1
            return out
        while True:
            colon = self.text.find(":", self.pos)
            key = self.text[self.pos:colon].strip() if colon >= 0 else ""
            if not key or any(c in key for c in "{}[],") or QUOTE in key:
                raise _Malformed("a key")
            self.pos = colon + 1
            out[key] = self.value()
            self.skip_space()
            if self.at("}"):
                self.pos += 1
                return out
            self.expect(",")
            self.skip_space()

    def array(self) -> list[Any]:
        self.expect("[")
        out: list[Any] = []
        self.skip_space()
        if self.at("]"):
            self.pos += 1
            return out
        while True:
            out.append(self.value())
            self.skip_space()
            if self.at("]"):
                self.pos += 1
                return out
            self.expect(",")


def _bare(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if text.lower() in _NULLS:
        return None
    if _NUMBER.fullmatch(text):
        return json.loads(text)
    return text
