"""A request whose decode node failed after its first token reached the client goes on elsewhere.

The client already holds tokens, so the request cannot start over (``attempts.py`` does that before the
first token). But the gateway holds everything a recompute needs: the prompt, every token the nodes sent it,
and the resolved sampling (the seed included — the seeded sampler is keyed by output position, so a
sampled request draws the same tokens; a grammar's state is rebuilt from the tokens). It hands the request
as tokens only (``Adopt`` with ``num_computed_tokens`` 0 and no KV keys; a gateway may send nothing else) to
the healthy decode nodes it has not failed on, most free blocks first. The first that grants computes the
KV of prompt and tokens and decodes on; the gateway attaches there, and the client sees the stream go on
(tokens the failed node made that never reached the gateway are made again). Dynamo migrates a request
the same way when its worker drops mid-stream.

Each resume spends one of the request's ``--resumes-after-first-token``. The failures that qualify are the
node's (``UNAVAILABLE``: the process died, hung past keepalive, or aborted the request when draining past
its drain timeout), not the request's (an abort for its structured output, say).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import grpc.aio
import structlog

from services.common.errors import UnavailableError
from services.gateway import node_client
from services.gateway.attempts import node_failure
from services.gateway.directory import NodeDirectory
from services.gateway.generation import PreparedRequest
from services.gateway.nodes import DECODE

log = structlog.get_logger(__name__)

REQUEST_FAILURES = ("structured output",)
"""Abort reasons that are the request's own: resuming elsewhere would fail the same way."""


class DecodeAbortError(UnavailableError):
    """A decode node ended the request itself (``finish_reason`` abort): ``resumable`` unless the reason is
    the request's own."""

    def __init__(self, address: str, reason: str):
        super().__init__(f"decode node {address} aborted the request: {reason or 'no reason given'}")
        self.resumable = not reason.startswith(REQUEST_FAILURES)


def resumable(failure: Exception) -> bool:
    """A failure of the node's (``UNAVAILABLE``), not of the request's."""
    return node_failure(failure) and getattr(failure, "resumable", True)


async def adopt_elsewhere(directory: NodeDirectory, request_id: str, request: PreparedRequest,
                          generated: Sequence[int], exclude: Collection[str], deadline_unix_ms: int,
                          timeout_s: float, metadata: Any = None) -> str | None:
    """Offer the request, as tokens only, to the healthy decode nodes not in ``exclude`` (most free blocks
    first): the address of the first that granted, or None when none did."""
    nodes = sorted((n for n in directory.nodes(DECODE) if n.healthy and n.address not in exclude),
                   key=lambda n: -n.blocks_free)
    sampling = dataclasses.replace(request.sampling, stop=())  # stop strings are the gateway's
    for node in nodes:
        peers = [n.address for n in nodes if n is not node]
        try:
            granted, reason = await node_client.adopt_tokens(
                directory.stub(node.address), request_id, request.prompt_ids, generated, sampling, peers,
                deadline_unix_ms, timeout_s, metadata)
        except grpc.aio.AioRpcError as error:
            log.warning("resume: the decode node failed the offer", request_id=request_id, node=node.address,
                        code=error.code().name, details=error.details())
            continue
        if granted:
            return node.address
        log.info("resume: the decode node refused", request_id=request_id, node=node.address, reason=reason)
    return None
