"""OpenAI's harmony format (GPT-OSS), read as it streams: the output is a series of messages, each a header
and a body::

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.

The first header follows the prompt's ``<|start|>assistant``; a header names the message's channel
(``analysis``: the reasoning, ``commentary``: calls and preambles, ``final``: the answer) and, for a call, its
recipient (``to=functions.get_weather``: one of the request's tools; ``to=python`` or ``to=browser.search``: a
built-in tool of OpenAI's, not served here, read as the text of its channel); a body ends at ``<|end|>``,
``<|call|>`` or ``<|return|>`` (the last two are end-of-sequence tokens, usually cut from the output) or where
the output ends. Text outside any message
(an output that is not harmony at all) is read as such. The markers are special tokens: the output must be
decoded with them kept (the parsers' ``markers``).

:class:`HarmonyReader` turns pieces of text into events, holding back text that may be the start of a marker,
so any chunking of an output gives the same events (adjacent texts of one kind may be split differently).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from services.gateway.openai.reasoning.markers import held_back_length

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
_OPENERS = (START, CHANNEL)  # what begins a header outside a message
_CLOSERS = (END, CALL, RETURN, START)  # what ends a body (a START: the next message, its end left out)
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([\w-]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
FUNCTIONS = "functions."  # the recipients that are the request's tools (others: built-in browser, python)


@dataclass(frozen=True)
class Header:
    """``raw``: the header as written, from its ``<|start|>`` or ``<|channel|>`` through ``<|message|>``."""

    raw: str
    channel: str | None
    recipient: str | None

    @classmethod
    def of(cls, raw: str) -> Header:
        channel = _CHANNEL.search(raw)
        recipient = _RECIPIENT.search(raw)
        return cls(raw, channel.group(1) if channel else None, recipient.group(1) if recipient else None)

    @property
    def function(self) -> str | None:
        """The tool this message calls (``to=functions.NAME``), None for any other message."""
        if self.recipient is None or not self.recipient.startswith(FUNCTIONS):
            return None
        return self.recipient.removeprefix(FUNCTIONS)


@dataclass(frozen=True)
class Event:
    """``outside``: text outside any message; ``open``: a message's ``header`` is complete; ``body``: text of
    the open message; ``close``: it ended, at ``text`` (its end marker; "" where the output or the next
    ``<|start|>`` ended it)."""

    kind: Literal["outside", "open", "body", "close"]
    text: str = ""
    header: Header | None = None


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """The earliest of ``markers`` in ``text`` (its index and itself), or (-1, "")."""
    found = [(text.find(m), m) for m in markers]
    found = [(i, m) for i, m in found if i >= 0]
    return min(found) if found else (-1, "")


def _held(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that is a proper start of one of ``markers``."""
    return max(held_back_length(text, marker) for marker in markers)


class HarmonyReader:
    """One output's text in, :class:`Event` s out (see the module)."""

    def __init__(self) -> None:
        self._mode: Literal["outside", "header", "body"] = "outside"
        self._pending = ""  # text not yet released: a header being read, or what may start a marker

    def feed(self, text: str) -> list[Event]:
        self._pending += text
        events: list[Event] = []
        while True:
            if self._mode == "outside":
                at, marker = _first(self._pending, _OPENERS)
                if at < 0:
                    keep = _held(self._pending, _OPENERS)
                    return events + self._release("outside", len(self._pending) - keep)
                events += self._release("outside", at)
                self._mode = "header"
            elif self._mode == "header":
                at, marker = _first(self._pending, (MESSAGE, *_CLOSERS[:-1]))
                if at < 0:
                    return events
                if marker != MESSAGE:  # a header that ends before its body: not a message, outside text
                    events.append(Event("outside", self._pending[:at + len(marker)]))
                    self._pending, self._mode = self._pending[at + len(marker):], "outside"
                    continue
                raw, self._pending = self._pending[:at + len(MESSAGE)], self._pending[at + len(MESSAGE):]
                events.append(Event("open", header=Header.of(raw)))
                self._mode = "body"
            else:
                at, marker = _first(self._pending, _CLOSERS)
                if at < 0:
                    keep = _held(self._pending, _CLOSERS)
                    return events + self._release("body", len(self._pending) - keep)
                events += self._release("body", at)
                ended = "" if marker == START else marker
                self._pending = self._pending[len(ended):]
                events.append(Event("close", ended))
                self._mode = "outside"

    def finish(self) -> list[Event]:
        """The output ended: a message still open closes, a header never completed is outside text."""
        rest, self._pending = self._pending, ""
        mode, self._mode = self._mode, "outside"
        if mode == "body":
            return ([Event("body", rest)] if rest else []) + [Event("close")]
        return [Event("outside", rest)] if rest else []

    def _release(self, kind: Literal["outside", "body"], size: int) -> list[Event]:
        text, self._pending = self._pending[:size], self._pending[size:]
        return [Event(kind, text)] if text else []
