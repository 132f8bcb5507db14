"""A long prompt is templated and tokenized on a worker thread: the gateway's event loop keeps serving
meanwhile, and the request is the same as if it had been tokenized on the loop."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from pdserve.v1 import gateway_pb2

from services.common.errors import UnavailableError
from services.engine.errors import InvalidRequestError
from services.engine.tokenizer import ChatMessage
from services.gateway.generation import GenerateInput
from services.gateway.tokenizing import INLINE_CHARS, INLINE_MESSAGES, tokenizes_inline
from tests.gateway.conftest import MAX_MODEL_LEN

CJK = "漢字のテキスト"  # about two tokens a character: the slowest text per character to tokenize


def test_short_prompts_stay_on_the_loop_and_long_ones_do_not():
    assert tokenizes_inline("x" * INLINE_CHARS, None)
    assert not tokenizes_inline("x" * (INLINE_CHARS + 1), None)
    assert tokenizes_inline(None, [ChatMessage("user", "hi")] * INLINE_MESSAGES)
    assert not tokenizes_inline(None, [ChatMessage("user", "")] * (INLINE_MESSAGES + 1))
    assert not tokenizes_inline(None, [ChatMessage("user", "x" * (INLINE_CHARS // 2 + 1))] * 2)
    assert tokenizes_inline(None, None)  # token ids: nothing to tokenize


async def loop_turns_while(awaitable) -> tuple[int, object]:
    """How many times another task ran while ``awaitable`` was pending, and its outcome."""
    turns = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal turns
        while not done.is_set():
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.create_task(ticker())
    try:
        outcome: object = await awaitable
    except Exception as error:  # the outcome is the test's to check
        outcome = error
    finally:
        done.set()
        await task
    return turns, outcome


async def test_a_prompt_past_the_context_is_refused_while_the_loop_keeps_running(cluster, tokenizer):
    text = CJK * (MAX_MODEL_LEN * tokenizer.max_token_chars // len(CJK))  # under the character guard
    turns, outcome = await loop_turns_while(cluster.gateway.core.open(GenerateInput(prompt=text), None))
    assert isinstance(outcome, InvalidRequestError) and outcome.field == "prompt"
    assert "do not fit the context" in outcome.message
    assert turns > 10, "the loop stood still while the prompt was tokenized"
    assert cluster.gateway.core.in_flight == 0 and not cluster.p.requests


async def test_many_messages_are_templated_off_the_loop_too(cluster):
    messages = [ChatMessage("user", CJK * 57)] * 100  # 39,900 characters: under the character guard
    turns, outcome = await loop_turns_while(cluster.gateway.core.open(GenerateInput(messages=messages), None))
    assert isinstance(outcome, InvalidRequestError) and outcome.field == "prompt"
    assert turns > 10


async def test_a_chat_whose_template_takes_tools_or_variables_is_templated_off_the_loop(cluster, tokenizer,
                                                                                         monkeypatch):
    """Tools and ``chat_template_kwargs`` are the client's and their size is not counted: a short message
    with either goes to a worker thread all the same (a template variable can hold megabytes)."""
    from services.engine.chat_template import ChatTemplateOptions

    assert not tokenizes_inline(None, [ChatMessage("user", "hi")], templated=True)
    threads = []
    real = tokenizer.apply_chat_template
    monkeypatch.setattr(tokenizer, "apply_chat_template",
                        lambda *args, **kwargs: threads.append(threading.current_thread()) or real(*args, **kwargs))
    hi = [ChatMessage("user", "hi")]
    tool = {"type": "function", "function": {"name": "f"}}
    for request in (GenerateInput(messages=hi), GenerateInput(messages=hi, tools=[tool]),
                    GenerateInput(messages=hi, template=ChatTemplateOptions(kwargs={"date_string": "x" * 100_000}))):
        await cluster.gateway.core.prepare_off_loop(request)
    assert [thread is threading.main_thread() for thread in threads] == [True, False, False]


async def test_a_long_prompt_that_fits_runs_with_the_tokens_the_loop_would_give(cluster, tokenizer):
    text = " hello" * 410  # 2460 characters, 410 tokens
    assert not tokenizes_inline(text, None)
    responses = [r async for r in cluster.stub.Generate(
        gateway_pb2.GenerateRequest(prompt=text, sampling=gateway_pb2.SamplingParams(max_tokens=1)), timeout=10)]
    assert responses[-1].finish_reason
    assert list(cluster.p.requests[0].prompt_token_ids) == tokenizer.encode(text)
    assert responses[-1].usage.prompt_tokens == len(tokenizer.encode(text))


async def test_a_drain_that_begins_during_tokenizing_refuses_the_request(cluster):
    core = cluster.gateway.core
    opening = asyncio.create_task(core.open(GenerateInput(prompt=" hello" * 410), None))
    await asyncio.sleep(0)  # the task is now waiting for its worker thread
    await core.drain(0.0)
    with pytest.raises(UnavailableError, match="draining"):
        await opening
    assert core.in_flight == 0 and not cluster.p.requests


async def test_grpc_refuses_a_long_prompt_by_name_as_before(cluster, tokenizer):
    text = CJK * (MAX_MODEL_LEN * tokenizer.max_token_chars // len(CJK))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in cluster.stub.Generate(gateway_pb2.GenerateRequest(prompt=text), timeout=10):
            pass
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt" in error.value.details() and "do not fit the context" in error.value.details()
