"""The decode node's side of CUDA IPC: prefill nodes' KV pools mapped here, and block copies out of them.

``IpcSessions.open`` answers a prefill node's ``OpenKVIpc`` offer: it checks that the two processes share
a host and a GPU (``kvcache.host_identity``) and a KV layout, maps the offered pool and probe, and reads
the probe back. Only an offer whose probe reads back as its nonce's pattern becomes a session. ``copy``
moves blocks from a session's pool into this node's pool device to device and returns once they are
there, so the transfer stream may acknowledge them (and the prefill node release them) right after.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
import torch

from kvcache.cuda_ipc import (
    CudaIpcTensor,
    IpcError,
    check_pools_match,
    copy_blocks,
    open_tensor,
    probe_digest,
    probe_pattern,
    read_probe,
)
from kvcache.host_identity import HostIdentity, ipc_refusal
from services.engine_node.kv_ipc_wire import IpcAnswer, IpcOffer

log = structlog.get_logger(__name__)
LAYOUT_FIELDS = ("dtype", "block_size", "num_layers", "num_kv_heads", "head_dim", "model_fingerprint",
                 "bytes_per_block")


class KVLayout(Protocol):
    """The layout fields an offer must match (``services.engine_node.kv_layout`` gives this node's)."""

    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    model_fingerprint: bytes
    bytes_per_block: int


@dataclass
class _Session:
    identity: HostIdentity
    pool: torch.Tensor
    """The prefill node's pool, mapped into this process."""
    owner: str = ""
    """The caller that offered it (``caller_identity.py``): only its KV headers may name the session."""


class IpcSessions:
    """Prefill nodes' pools mapped by CUDA IPC, by session id (one per prefill process).

    ``identity`` is None when this node does not take IPC (``kv_ipc`` off, or a CPU pool): every offer is
    then refused with that reason. ``opener`` and ``reader`` map and read tensors (tests pass fakes)."""

    def __init__(self, pool: torch.Tensor, layout: KVLayout, identity: HostIdentity | None,
                 opener: Callable[[CudaIpcTensor, torch.device], torch.Tensor] = open_tensor,
                 reader: Callable[[torch.Tensor], bytes] = read_probe):
        self.pool = pool
        self.layout = layout
        self.identity = identity
        self.sessions: dict[str, _Session] = {}
        self._open = opener
        self._read = reader
        self._stream = torch.cuda.Stream(pool.device) if pool.device.type == "cuda" else None

    def open(self, offer: IpcOffer, owner: str = "") -> IpcAnswer:
        """Check, map and probe an offer of caller ``owner``. A refusal is an answer with the reason
        (logged), not an error."""
        checked = self._check(offer, owner)
        if isinstance(checked, str):
            log.info("kv ipc refused", session=offer.session_id, peer_pid=offer.identity.pid, reason=checked)
            return IpcAnswer(accepted=False, reason=checked)
        session, digest = checked
        self.prune()
        # the same prefill process (as its caller's offers say) offers again: its new session wins
        replaced = [s for s, old in self.sessions.items() if old.identity == offer.identity and old.owner == owner]
        for session_id in replaced:
            del self.sessions[session_id]
        self.sessions[offer.session_id] = session
        log.info("kv ipc session open", session=offer.session_id, peer_pid=offer.identity.pid,
                 peer_blocks=session.pool.shape[1])
        return IpcAnswer(accepted=True, probe_digest=digest)

    def owner_of(self, session_id: str) -> str | None:
        """The caller that opened ``session_id``; None when this node holds no such session."""
        session = self.sessions.get(session_id)
        return None if session is None else session.owner

    def _check(self, offer: IpcOffer, owner: str) -> tuple[_Session, bytes] | str:
        """The mapped session and the probe's digest, or why the offer is refused."""
        if self.identity is None:
            return "this decode node takes no CUDA IPC (kv_ipc off or a CPU pool)"
        held = self.sessions.get(offer.session_id)
        if held is not None and held.owner != owner:  # a session is its opener's: nobody else replaces it
            return "session_id is another caller's session"
        refusal = ipc_refusal(self.identity, offer.identity)
        if refusal is not None:
            return refusal
        for name in LAYOUT_FIELDS:
            if getattr(offer.layout, name) != getattr(self.layout, name):
                return f"layout.{name} differs"
        try:
            pool = self._open(offer.pool, self.pool.device)
            check_pools_match(pool, self.pool)
            read = self._read(self._open(offer.probe, self.pool.device))
        except IpcError as exc:
            return str(exc)
        if not read or read != probe_pattern(offer.probe_nonce, len(read)):
            return "the probe read back other bytes than its pattern"
        return _Session(offer.identity, pool, owner), probe_digest(read)

    def copy(self, session_id: str, source_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        """Blocks ``source_ids`` of the session's pool into ``block_ids`` of this node's pool, complete on
        return. Raises :class:`IpcError` (unknown session, bad ids, a CUDA error)."""
        session = self.sessions.get(session_id)
        if session is None:
            raise IpcError(f"no CUDA IPC session {session_id!r} on this decode node (restarted?)")
        copy_blocks(session.pool, self.pool, source_ids, block_ids, self._stream)

    def prune(self) -> list[str]:
        """Unmap the pools of prefill processes that are gone (a mapping keeps their GPU memory
        allocated), as far as this process can see them (same PID namespace). Returns the sessions
        dropped."""
        gone = [s for s, session in self.sessions.items() if not _alive(session.identity, self.identity)]
        for session_id in gone:
            del self.sessions[session_id]
            log.info("kv ipc session closed: its prefill process is gone", session=session_id)
        return gone

    def close(self) -> None:
        self.sessions.clear()


def _alive(peer: HostIdentity, local: HostIdentity | None) -> bool:
    if local is None or peer.pid_namespace != local.pid_namespace or not peer.pid_namespace:
        return True  # cannot tell from here
    try:
        os.kill(peer.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
