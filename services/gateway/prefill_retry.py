"""When a request may run again on another prefill node, and the id it runs under there.

A prefill node that fails before the request's first token reached the client (its process died, it hung
until keepalive gave up, it is draining, its stream ended early: all ``UNAVAILABLE`` at the gateway) has
shown the client nothing, so the request can start over on another prefill node — vLLM's and SGLang's
routers and Dynamo's request migration do the same for a worker that drops before any output. Other
codes say something about the request (``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED``: no decode node had
room, ``DEADLINE_EXCEEDED``, ``FAILED_PRECONDITION``) and are the client's answer as they are.

Each attempt has an id of its own on the nodes (``<request id>~retry<N>-<random>``): a hung node that
wakes up later can only touch its own attempt (whose reservations the gateway aborted, and whose leases
end), never the reservation or KV of the attempt that replaced it. The client sees the request id it
gave (or was given) only.
"""

from __future__ import annotations

import secrets

import grpc

from services.common.errors import mapped_errors, status_of


class PrefillRetry:
    def __init__(self, request_id: str, retries: int) -> None:
        self.request_id = request_id
        self.retries_left = retries
        self.attempt_id = request_id  # the first attempt runs under the request's own id
        self.failed_nodes: frozenset[str] = frozenset()

    def allows(self, failure: Exception) -> bool:
        """A retry is left and ``failure`` (a prefill leg's, before the first token) may be the node's."""
        return self.retries_left > 0 and isinstance(failure, mapped_errors()) \
            and status_of(failure) == grpc.StatusCode.UNAVAILABLE

    def next_attempt(self, failed_node: str) -> str:
        """Count a retry away from ``failed_node`` (not chosen again for this request); the new attempt id."""
        self.retries_left -= 1
        self.failed_nodes |= {failed_node}
        self.attempt_id = f"{self.request_id}~retry{len(self.failed_nodes)}-{secrets.token_hex(3)}"
        return self.attempt_id
