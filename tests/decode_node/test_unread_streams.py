"""The token stream of a request that finished with nobody attached (the gateway went away and its
``Abort`` was lost) is dropped after ``unread_stream_s``: it no longer stays in the node for good (counted in
``calls_in_flight``, holding up a drain). A stream that is being read is left alone. The real model."""

from __future__ import annotations

import asyncio

import pytest

from services.decode_node.node import DecodeNode, TokenStream
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.gateway.fakes import eventually

pytestmark = pytest.mark.slow

SHORT = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


async def test_a_finished_request_nobody_attached_to_is_dropped_and_a_read_one_is_kept(fp32_model,
                                                                                       bundled_tokenizer):
    node = DecodeNode(make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16), num_threads=2,
                      unread_stream_s=2.0)
    node.start()
    try:
        prompt = bundled_tokenizer.encode("The sea is")
        for rid in ("unread", "read"):  # as if committed after a prefill
            node.streams[rid] = TokenStream()
            await node.worker.call(lambda e, rid=rid: e.add_request(sampling=SHORT, token_ids=prompt,
                                                                    request_id=rid))
        while await node.worker.call(lambda e: e.has_unfinished()):  # both finish, nobody attached
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # their last outputs reach the streams (delivered on this loop)
        reader = node.attach("read")
        first = await anext(reader)  # attached after it finished, before its drop was due: kept
        await eventually(lambda: "unread" not in node.streams, timeout_s=60, what="the unread stream dropped")
        await asyncio.sleep(0.5)  # past the read stream's own drop time
        assert "read" in node.streams
        tokens = list(first.token_ids) + [t async for event in reader for t in event.token_ids]
        assert len(tokens) == 3 and node.streams == {}
        assert not await node.worker.call(lambda e: e.has_unfinished())
    finally:
        await node.stop()
