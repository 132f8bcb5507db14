"""The attempts of one request: when it may start over on other nodes, and the id each attempt runs under.

A node that fails a request before its first token reached the client (a prefill or decode node whose
process died, that hung until keepalive gave up, that is draining, whose stream ended early: all
``UNAVAILABLE`` at the gateway) has shown the client nothing, so the request can start over on other
nodes — vLLM's and SGLang's routers and Dynamo's request migration do the same for a worker that drops
before any output. Other codes say something about the request (``INVALID_ARGUMENT``,
``RESOURCE_EXHAUSTED``: no decode node had room, ``DEADLINE_EXCEEDED``, ``FAILED_PRECONDITION``,
``INTERNAL``) and are the client's answer as they are. A node that failed an attempt is not chosen again
for the request.

Each attempt after the first has an id of its own on the nodes (``<request id>~retry<N>-<random>``): a hung
node that wakes up later can only touch its own attempt (which the gateway aborted, and whose leases end),
never the reservation or KV of the attempt that replaced it. So does the first attempt of a request whose
id an earlier request left on a node that never answered its ``Abort`` (``<request id>~<random>``): that
node's cleanup, when it wakes up, would abort whatever runs under the id. The client sees only the
request id it gave (or was given).
"""

from __future__ import annotations

import secrets

import grpc

from services.common.errors import mapped_errors, status_of


def node_failure(failure: Exception) -> bool:
    """``failure`` may be the node's fault (``UNAVAILABLE``: gone, hung, draining, its stream cut)."""
    return isinstance(failure, mapped_errors()) and status_of(failure) == grpc.StatusCode.UNAVAILABLE


class Attempts:
    def __init__(self, request_id: str, retries: int, fresh_first: bool = False) -> None:
        """``fresh_first``: the first attempt too runs under an id of its own (an earlier request with
        this id left a node that did not answer its ``Abort``)."""
        self.request_id = request_id
        self.retries_left = retries
        # the first attempt runs under the request's own id (the nodes' logs and spans carry it), unless
        # a node that never answered an Abort of that id may still act on it
        self.attempt_id = f"{request_id}~{secrets.token_hex(3)}" if fresh_first else request_id
        self.failed_nodes: frozenset[str] = frozenset()

    def may_retry(self, failure: Exception) -> bool:
        """A retry is left and ``failure`` (a node's, before the first token) may be the node's fault."""
        return self.retries_left > 0 and node_failure(failure)

    def next_attempt(self, failed_node: str) -> str:
        """Count a retry away from ``failed_node`` (not chosen again for this request); the new attempt id."""
        self.retries_left -= 1
        self.failed_nodes |= {failed_node}
        self.attempt_id = f"{self.request_id}~retry{len(self.failed_nodes)}-{secrets.token_hex(3)}"
        return self.attempt_id
