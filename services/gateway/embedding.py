"""Embeddings: one input run on a prefill node alone (``PrefillNode.Embed``; no decode node), answered with the
final hidden state of its last token (last-token pooling, as causal decoder embedding models such as
Qwen3-Embedding and e5-mistral are read), then cut to ``dimensions`` and L2-normalised here (:func:`pooled`).

The prefill node is the router's pick for the prompt (``Router.route_prefill_only``: the longest cached prefix,
then the least loaded, ties rotating). A node
that fails or is draining (``UNAVAILABLE``) before it answers is left for the next healthy one, as many times as
``retries_before_first_token`` allows; other errors keep their code. Each call runs under an id of its own on the
node (``embed-…``), so a client's id never meets a ``Generate`` of the same id there.
"""

from __future__ import annotations

import math
import time
import uuid
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from services.common import tracing
from services.gateway import node_client
from services.gateway.directory import NodeDirectory
from services.gateway.generation import NodeCallError
from services.gateway.nodes import PREFILL
from services.gateway.router import Router


@dataclass(frozen=True)
class EmbedInput:
    """One input: exactly one of ``prompt`` and ``token_ids``."""

    request_id: str = ""
    prompt: str | None = None
    token_ids: Sequence[int] | None = None
    truncate_prompt_tokens: int | None = None  # as GenerateInput's (-1: the context's length)
    normalize: bool = True
    dimensions: int = 0  # 0: every value; else the first that many (Matryoshka), normalised after
    add_special_tokens: bool = True  # False: ``prompt``'s own tokens, without those the tokenizer adds to a text


@dataclass(frozen=True)
class Embedding:
    request_id: str
    values: list[float]
    prompt_tokens: int
    cached_tokens: int
    prefill_node: str


def pooled(state: Sequence[float], normalize: bool, dimensions: int) -> list[float]:
    """The last token's state as the client asked for it: its first ``dimensions`` values (0: all), then unit L2
    norm when ``normalize`` (a zero vector stays zero); float32 values, whether sent as JSON numbers or base64."""
    values = list(state[:dimensions] if dimensions else state)
    norm = math.sqrt(math.fsum(v * v for v in values)) if normalize else 0.0
    return array("f", [v / norm for v in values] if norm > 0 else values).tolist()


async def run_on_a_prefill_node(directory: NodeDirectory, router: Router, prompt_ids: Sequence[int],
                                deadline: float | None, retries: int, on_retry: Callable[[str], None]
                                ) -> tuple[list[float], int, str]:
    """``(state, cached tokens, node address)`` of the prompt, from the router's prefill node; ``UNAVAILABLE``
    from a node moves it to the next healthy one (up to ``retries`` times); ``NodeCallError`` with the node's
    code otherwise, ``NoHealthyNodeError`` when no prefill node is healthy."""
    tried: set[str] = set()
    failure: NodeCallError | None = None
    while True:
        candidates = [n for n in directory.nodes(PREFILL) if n.address not in tried]
        if failure is not None and not any(n.healthy for n in candidates):
            raise failure  # no other node to try: the last one's failure, not "none healthy"
        address = router.route_prefill_only(candidates, prompt_ids)
        directory.claim(address)
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            state, cached = await node_client.embed(directory.stub(address), f"embed-{uuid.uuid4().hex}",
                                                    prompt_ids, timeout, tracing.outgoing())
            return state, cached, address
        except grpc.aio.AioRpcError as error:
            code = error.code()
            if code == grpc.StatusCode.CANCELLED:  # not by us (that cancels this coroutine): the node went away
                code = grpc.StatusCode.UNAVAILABLE
            failure = NodeCallError(code, f"prefill node {address}: {error.details()}")
            past_deadline = deadline is not None and time.monotonic() >= deadline
            if code != grpc.StatusCode.UNAVAILABLE or len(tried) >= retries or past_deadline:
                raise failure from None
            tried.add(address)
            on_retry(PREFILL)
        finally:
            directory.release(address)
