"""The Responses API's rendering of one output (``responses_api/render.py``), fed chunks directly: the whole
response and the stream's events parse as the ``openai`` package's own models of them, every
chunking streams the items the whole response has, and the status, blank text and reasoning tokens follow
the rules of the module."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest
from openai.types.responses import Response, ResponseStreamEvent

from services.gateway.generation import GenerateChunk, Usage
from services.gateway.openai.output_split import OutputSplit
from services.gateway.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from services.gateway.openai.reasoning.qwen3 import Qwen3ReasoningParser
from services.gateway.openai.responses_api.body import ResponsesBody
from services.gateway.openai.responses_api.objects import ResponseObject
from services.gateway.openai.responses_api.render import ResponseEvents, ResponseRender
from services.gateway.openai.tools.hermes import HermesParser
from tests.gateway.openai.test_openai_front_tools import CALL

USAGE = Usage(3, 9, 2)
THOUGHT = "<think>\nThe user wants Paris.\n</think>\n\n"
OUTPUT = f"{THOUGHT}Looking it up.\n{CALL}"
END_ID = 17  # the reasoning end marker's one token, in the token ids below
EVENTS = {model.model_fields["type"].annotation.__args__[0]: model  # type → the openai package's event class
          for model in typing.get_args(typing.get_args(ResponseStreamEvent)[0])}


def render(reasoning: bool = True, tools: bool = True) -> ResponseRender:
    body = ResponsesBody(input="Weather in Paris?", tools=[{"type": "function", "name": "get_weather"}])
    split = OutputSplit(Qwen3ReasoningParser() if reasoning else None, HermesParser() if tools else None)
    return ResponseRender(ResponseObject.of(body, "resp-1", "m"), split, None, (END_ID,))


def whole_of(made: ResponseRender, text: str, token_ids=(), finish: str = "stop") -> dict:
    """The response to an output that came in one chunk."""
    events = ResponseEvents(made)
    events.chunk(GenerateChunk("r", tuple(token_ids), text, finish, USAGE))
    assert events.response is not None
    return events.response.model_dump(mode="json")


def shape(response: dict) -> list[tuple]:
    """The output items without their ids."""
    out = []
    for item in response["output"]:
        if item["type"] == "message":
            out.append(("message", item["status"], [p["text"] for p in item["content"]]))
        elif item["type"] == "reasoning":
            out.append(("reasoning", item["status"], [p["text"] for p in item["content"]]))
        else:
            out.append(("function_call", item["status"], item["name"], json.loads(item["arguments"])))
    return out


def stream(made: ResponseRender, pieces: list[str], finish: str = "stop", token_ids=(1, END_ID, 2)) -> list[dict]:
    """The events for ``pieces`` (the first chunk carries ``token_ids``, the last ends on ``finish``)."""
    events = ResponseEvents(made)
    sent = events.opening()
    for i, text in enumerate(pieces):
        last = i == len(pieces) - 1
        ids = tuple(token_ids) if i == 0 else ()
        sent += events.chunk(GenerateChunk("r", ids, text, finish if last else "", USAGE if last else None))
    parsed = []
    for data in sent:
        head, body = data.decode().split("\n", 1)
        event = json.loads(body.removeprefix("data: "))
        assert head == f"event: {event['type']}" and data.endswith(b"\n\n")
        EVENTS[event["type"]].model_validate(event)  # the openai package's own event models
        parsed.append(event)
    assert [e["sequence_number"] for e in parsed] == list(range(len(parsed)))
    return parsed


def test_text_after_a_call_is_a_second_message_however_it_is_chunked():
    output = f"Let me look.\n{CALL}\nAnd Rome.{CALL.replace('Paris', 'Rome')}"
    expected = [("message", "completed", ["Let me look."]),
                ("function_call", "completed", "get_weather", {"city": "Paris"}),
                ("message", "completed", ["And Rome."]),
                ("function_call", "completed", "get_weather", {"city": "Rome"})]

    def stripped(response: dict) -> list[tuple]:  # the parser may keep a line break around a call
        return [(*item[:2], [text.strip() for text in item[2]]) if item[0] == "message" else item
                for item in shape(response)]

    assert stripped(whole_of(render(reasoning=False), output)) == expected
    for size in (1, 4, 9):
        events = stream(render(reasoning=False), [output[i:i + size] for i in range(0, len(output), size)])
        assert stripped(events[-1]["response"]) == expected


def test_the_whole_output_is_a_reasoning_a_message_and_a_call():
    whole = whole_of(render(), OUTPUT, (5, 6, END_ID, 8, 9), "stop")
    Response.model_validate(whole)
    assert (whole["status"], whole["incomplete_details"], whole["store"]) == ("completed", None, False)
    assert shape(whole) == [("reasoning", "completed", ["\nThe user wants Paris.\n"]),
                            ("message", "completed", ["Looking it up."]),
                            ("function_call", "completed", "get_weather", {"city": "Paris"})]
    call = whole["output"][2]
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    assert whole["usage"] == {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                              "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 3},
                              "total_tokens": 12}


@pytest.mark.parametrize("size", [1, 2, 5, 13, 1000])
def test_every_chunking_streams_the_items_of_the_whole(size):
    whole = whole_of(render(), OUTPUT, (1, END_ID, 2), "stop")
    events = stream(render(), [OUTPUT[i:i + size] for i in range(0, len(OUTPUT), size)])
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    Response.model_validate(final)
    assert shape(final) == shape(whole) and final["usage"] == whole["usage"]
    for index, item in enumerate(final["output"]):  # each item: added, its deltas, done; ids agree
        added = next(e for e in events if e["type"] == "response.output_item.added" and e["output_index"] == index)
        done = next(e for e in events if e["type"] == "response.output_item.done" and e["output_index"] == index)
        assert added["item"]["id"] == done["item"]["id"] == item["id"] and done["item"] == item
        deltas = "".join(e["delta"] for e in events if e["type"].endswith(".delta") and e.get("item_id") == item["id"])
        assert deltas == (item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"])


def test_a_length_cut_is_incomplete_and_so_is_the_item_it_cut():
    made = render(tools=False)
    whole = whole_of(made, f"{THOUGHT}Looking it", (1, END_ID, 2), "length")
    assert (whole["status"], whole["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert shape(whole) == [("reasoning", "completed", ["\nThe user wants Paris.\n"]),
                            ("message", "incomplete", ["Looking it"])]
    events = stream(made, [THOUGHT, "Looking", " it"], finish="length")
    assert events[-1]["type"] == "response.incomplete" and shape(events[-1]["response"]) == shape(whole)

    r1 = dataclasses.replace(made, split=OutputSplit(DeepSeekR1ReasoningParser()))  # no opening marker
    thinking = whole_of(r1, "Still think", (1, 2, 3), "length")
    assert shape(thinking) == [("reasoning", "incomplete", ["Still think"])]
    assert thinking["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}  # no end marker: all of them


def test_blank_text_between_the_reasoning_and_a_call_is_no_message():
    output = f"{THOUGHT}{CALL}"
    whole = whole_of(render(), output, (1, END_ID), "stop")
    assert [item[0] for item in shape(whole)] == ["reasoning", "function_call"]
    assert shape(stream(render(), [output[:len(THOUGHT)], "\n", output[len(THOUGHT):]])[-1]["response"]) == \
        shape(whole)


def test_an_empty_output_is_one_empty_message_and_plain_text_is_kept_as_it_is():
    for text, pieces in (("", [""]), (" Hello there", [" ", "Hello", " there"])):
        whole = whole_of(render(reasoning=False, tools=False), text, (), "stop")
        assert shape(whole) == [("message", "completed", [text])]
        assert whole["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
        final = stream(render(reasoning=False, tools=False), pieces, token_ids=())[-1]["response"]
        assert shape(final) == shape(whole)


def test_a_failure_ends_the_stream_with_response_failed():
    made = render(tools=False)
    events = ResponseEvents(made)
    sent = events.opening() + events.chunk(GenerateChunk("r", (1,), f"{THOUGHT}Looking"))
    sent += events.failed(503, "the decode node failed")
    last = json.loads(sent[-1].decode().split("\n", 1)[1].removeprefix("data: "))
    EVENTS[last["type"]].model_validate(last)
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"] == {"code": "server_error", "message": "the decode node failed"}
    assert [item[:2] for item in shape(last["response"])] == [("reasoning", "completed"), ("message", "incomplete")]
