"""What a ``TransferKV`` message must pass before it may touch its request, per stream.

- ``seq`` strictly increasing on the stream (``INVALID_ARGUMENT`` naming seq);
- the grant's token (``grants.py``): a ``KVHeader``, ``KVKeepAlive`` or ``KVCommit`` carries it; a
  ``KVBlockBatch`` or ``KVState`` is bound to its stream: accepted only for a request whose header presented the grant's
  current token on this same stream (a grant re-made under the same id after an abort has a new token, so
  an older header does not open it). Missing or wrong: ``PERMISSION_DENIED`` naming "grant token";
- a header's ``ipc_session``: one this node accepted (``INVALID_ARGUMENT`` naming ipc_session), opened by
  this same caller (``PERMISSION_DENIED``).

A message refused here changes nothing: the grant, its blocks and its lease stay as they were (only
messages that present the grant's token renew the lease), and the request is not failed on the stream —
its rightful holder, on its own stream, goes on. The servicer answers the refusal in the message's ack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.common.errors import InvalidArgumentError
from services.decode_node.grants import Grants, PermissionDeniedError
from services.decode_node.kv_ipc import IpcSessions


@dataclass
class TransferGate:
    grants: Grants
    ipc: IpcSessions
    caller: str  # caller_identity.caller_of the stream
    last_seq: int = -1
    verified: dict[str, bytes] = field(default_factory=dict)  # request id → the token its header presented here
    ipc_sessions: dict[str, str] = field(default_factory=dict)  # request id → the IPC session its header named

    def check_seq(self, seq: int) -> None:
        if seq <= self.last_seq:
            raise InvalidArgumentError("seq", f"{seq} is not greater than the stream's last seq {self.last_seq}")
        self.last_seq = seq

    def admit(self, message: Any, kind: str, request_id: str) -> None:
        """Raise (a mapped error) unless ``message`` (of ``kind``) may act on ``request_id``'s grant."""
        if kind == "header":
            header = message.header
            self.grants.check(request_id, header.grant_token)
            if header.ipc_session:
                self._check_session(header.ipc_session)
            self.verified[request_id] = header.grant_token
            if header.ipc_session:
                self.ipc_sessions[request_id] = header.ipc_session
        elif kind in ("blocks", "state"):
            token = self.verified.get(request_id)
            if token is None:
                if not self.grants.live(request_id):
                    self.grants.check(request_id, b"")  # raises NOT_FOUND
                raise PermissionDeniedError(f"grant token: no header of {request_id!r} presented it on this stream")
            self.grants.check(request_id, token)
        else:  # keepalive, commit
            self.grants.check(request_id, getattr(message, kind).grant_token)

    def _check_session(self, session_id: str) -> None:
        owner = self.ipc.owner_of(session_id)
        if owner is None:
            raise InvalidArgumentError("ipc_session", "names no CUDA IPC session this decode node accepted "
                                                      "(restarted?)")
        if owner != self.caller:
            raise PermissionDeniedError("ipc_session: the session was opened by another caller")
