"""A KV stream that fails fails the acks still pending, and those failures are seen as retrieved: the
batches' acks nobody awaits no longer print "Future exception was never retrieved" blocks (plain-text
ERROR lines in the node's JSON log) when a decode node dies mid-transfer."""

from __future__ import annotations

import asyncio
import gc

import pytest

from services.common.errors import UnavailableError
from services.prefill_node.kv_sender import KVSender


async def test_a_failed_stream_fails_its_pending_acks_without_unretrieved_exceptions():
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    sender = KVSender(None, "r1", None, [0, 1], "127.0.0.1:1")
    awaited, unawaited = loop.create_future(), loop.create_future()
    sender._pending.update({1: awaited, 2: unawaited})
    sender._fail("the stream broke")
    with pytest.raises(UnavailableError, match=r"decode node 127\.0\.0\.1:1: the stream broke"):
        await awaited
    del unawaited, sender
    gc.collect()
    await asyncio.sleep(0)
    assert [c["message"] for c in reported] == []
