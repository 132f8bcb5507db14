"""Capability-scoped reservations on the decode node: each live grant's token and holder, bounds per caller.

A ``Reserve`` that is granted gets a token (``secrets.token_bytes(32)``), known only to this node and the
caller. Every later message of the request must be backed by it: :meth:`Grants.check` compares in
constant time (``hmac.compare_digest``) and raises :class:`PermissionDeniedError` naming "grant token"
(never the token) when it is missing or wrong, before anything of the request is touched. A record
lives from the ``Reserve`` (pending while the engine decides) until the commit, an abort or the lease's
expiry; what came after is the running request, which no prefill node may touch again.

Bounds per caller (the certificate's common name, else the peer's host on a plaintext port): a caller
holds at most ``max_reservations`` live grants (the node passes at most a fraction of the batch's
``max_num_seqs``: grants take decode slots, and one caller holding them all would refuse everyone else
"no free slot") and ``max_blocks`` blocks in them (past its first grant,
which the pool alone bounds: a prompt is never refused for good by this), pending ones included,
so concurrent ``Reserve`` calls cannot race past the bound. :meth:`Grants.hold` refuses beyond either
(``ResourceExhaustedError`` naming the bound) before the engine is asked, so the request is not even
remembered as a waiter: its need never holds blocks back from others (``reserve_waiters.py``). The node
answers that refusal as ``granted = false`` with the bound as the reason, like a full node: a legitimate
prefill node at its bound retries as its own grants commit, and its ``Prefill`` ends
``RESOURCE_EXHAUSTED`` naming the bound when none frees in time.

Torch-free and grpc-free but for the status code; runs on the event loop.
"""

from __future__ import annotations

import hmac
import secrets
from collections import Counter
from dataclasses import dataclass, field

import grpc

from services.common.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError, ServiceError

TOKEN_BYTES = 32


class PermissionDeniedError(ServiceError):
    """The caller may not do this to that request (it does not hold the request's grant token)."""

    code = grpc.StatusCode.PERMISSION_DENIED


@dataclass(frozen=True)
class CallerBounds:
    max_reservations: int = 256  # live grants (pending ones included) per caller
    max_blocks: int = 1 << 62  # blocks in those grants per caller


@dataclass
class GrantRecord:
    caller: str
    blocks: int  # the grant's block count (before the engine answered: the most it can be)
    token: bytes = field(default=b"", repr=False)  # empty while the Reserve is pending; never logged


class Grants:
    def __init__(self, bounds: CallerBounds | None = None):
        self.bounds = bounds or CallerBounds()
        self.records: dict[str, GrantRecord] = {}

    def __len__(self) -> int:
        return len(self.records)

    def held_by(self, caller: str) -> tuple[int, int]:
        """(live grants, blocks in them) of ``caller``, pending ones included."""
        mine = [r for r in self.records.values() if r.caller == caller]
        return len(mine), sum(r.blocks for r in mine)

    def hold(self, request_id: str, caller: str, blocks: int) -> GrantRecord:
        """Count a pending grant of at most ``blocks`` blocks against ``caller``; raises
        ``ResourceExhaustedError`` naming the bound it would pass (nothing held then)."""
        if request_id in self.records:
            raise InvalidArgumentError("request_id", f"request {request_id!r} already holds blocks here")
        count, held = self.held_by(caller)
        bounds = self.bounds
        if count >= bounds.max_reservations:
            raise ResourceExhaustedError(f"max_reservations_per_caller: caller {caller!r} holds {count} live "
                                         f"reservations, at most {bounds.max_reservations} (the smaller of "
                                         "max_reservations_per_caller and max_reserved_blocks_per_caller_fraction "
                                         "of max_num_seqs)")
        if held and held + blocks > bounds.max_blocks:  # a first grant is bounded by the pool alone
            raise ResourceExhaustedError(f"max_reserved_blocks_per_caller: caller {caller!r} holds {held} blocks "
                                         f"in live reservations, {blocks} more would pass {bounds.max_blocks}")
        record = self.records[request_id] = GrantRecord(caller, blocks)
        return record

    def grant(self, request_id: str, record: GrantRecord, blocks: int) -> bytes | None:
        """The engine granted ``record``'s request ``blocks`` blocks: its new token. None when the record
        was released meanwhile (aborted while pending): the grant must not be answered."""
        if self.records.get(request_id) is not record:
            return None
        record.blocks, record.token = blocks, secrets.token_bytes(TOKEN_BYTES)
        return record.token

    def release(self, request_id: str, record: GrantRecord | None = None) -> None:
        """The grant ended (committed, aborted, expired, refused): it no longer counts. With ``record``:
        only if that is still the request's record."""
        if record is None or self.records.get(request_id) is record:
            self.records.pop(request_id, None)

    def check(self, request_id: str, token: bytes) -> GrantRecord:
        """The live grant of ``request_id`` if ``token`` is its token. Raises ``NotFoundError`` (no live
        grant) or ``PermissionDeniedError`` (missing or wrong token)."""
        record = self.records.get(request_id)
        if record is None or not record.token:
            raise NotFoundError(f"no reservation for {request_id!r} (expired, aborted, committed or never granted)")
        if not token:
            raise PermissionDeniedError(f"grant token: the message of {request_id!r} carries none")
        if not hmac.compare_digest(record.token, token):
            raise PermissionDeniedError(f"grant token: not the token of {request_id!r}'s grant")
        return record

    def live(self, request_id: str) -> bool:
        """Whether ``request_id`` holds a live (granted, not pending) grant here."""
        record = self.records.get(request_id)
        return record is not None and bool(record.token)

    def callers(self) -> Counter[str]:
        """Live grants per caller (for status and tests)."""
        return Counter(r.caller for r in self.records.values())
