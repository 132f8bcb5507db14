"""GPT-OSS's reasoning (``--reasoning-parser gpt_oss``; vLLM's name ``openai_gptoss`` too): the bodies of its
``analysis`` messages are the reasoning; those of ``final`` messages, commentary without a recipient (a
preamble to the user) and text outside any message are the content. A call of a tool (``to=functions.NAME``)
goes to the content as written, markers and all, for the tool-call parser (``--tool-call-parser gpt_oss``) to
read; a message to a built-in tool (``to=python``) is read as its channel's text. See
:mod:`services.gateway.openai.harmony` for the format.

Streaming gives the same split as :meth:`GptOssReasoningParser.split` for any chunking: both are the same
reader fed the text whole or in pieces.
"""

from __future__ import annotations

from services.gateway.openai.harmony import CHANNEL, MARKERS, MESSAGE, Event, HarmonyReader, Header
from services.gateway.openai.reasoning.types import ReasoningSplit


class HarmonyReasoningStream:
    def __init__(self) -> None:
        self._reader = HarmonyReader()
        self._header: Header | None = None

    def feed(self, text: str) -> ReasoningSplit:
        return self._split(self._reader.feed(text))

    def finish(self) -> ReasoningSplit:
        return self._split(self._reader.finish())

    def _split(self, events: list[Event]) -> ReasoningSplit:
        reasoning, content = [], []
        for event in events:
            header = self._header
            if event.kind == "outside":
                content.append(event.text)
            elif event.kind == "open":
                self._header = event.header
                if event.header is not None and event.header.function is not None:
                    content.append(event.header.raw)
            elif header is not None and header.function is not None:  # a call: as written
                content.append(event.text)
            elif event.kind == "body":
                (reasoning if header is not None and header.channel == "analysis" else content).append(event.text)
            if event.kind == "close":
                self._header = None
        return ReasoningSplit("".join(reasoning), "".join(content))


class GptOssReasoningParser:
    name = "gpt_oss"
    start_marker = CHANNEL + "analysis" + MESSAGE
    end_marker = CHANNEL + "final" + MESSAGE  # the answer follows it (a constraint starts after its tokens)
    markers = MARKERS

    def split(self, text: str) -> ReasoningSplit:
        stream = self.stream()
        first, last = stream.feed(text), stream.finish()
        return ReasoningSplit(first.reasoning + last.reasoning, first.content + last.content)

    def stream(self) -> HarmonyReasoningStream:
        return HarmonyReasoningStream()
