"""The CUDA IPC handshake between a prefill node and a decode node: its typed messages and their protos.

``KVIpcOffer`` goes from P to D once per (prefill process, decode node) pair (``DecodeNode.OpenKVIpc``);
``KVIpcAnswer`` comes back. The servicers and the nodes' IPC modules meet here, so that no proto travels
past a servicer (and this module is the bridge from ``kvcache``'s dataclasses to ``pdserve.v1``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.v1 import decode_pb2

from kvcache.cuda_ipc import CudaIpcTensor
from kvcache.host_identity import HostIdentity
from services.engine.kv_layout_spec import KVLayoutSpec
from services.engine_node.kv_layout import kv_layout, layout_from_proto

KV_IPC_MODES = ("auto", "off")
"""The ``kv_ipc`` setting of prefill and decode nodes: ``auto`` uses CUDA IPC with any peer that shares
this host and GPU and passes the probe (bytes otherwise); ``off`` always streams bytes."""


@dataclass(frozen=True)
class IpcOffer:
    session_id: str
    identity: HostIdentity
    layout: KVLayoutSpec
    pool: CudaIpcTensor
    probe: CudaIpcTensor
    probe_nonce: bytes


@dataclass(frozen=True)
class IpcAnswer:
    accepted: bool
    reason: str = ""
    probe_digest: bytes = b""


def identity_to_proto(identity: HostIdentity) -> decode_pb2.HostIdentity:
    return decode_pb2.HostIdentity(boot_id=identity.boot_id, ipc_namespace=identity.ipc_namespace,
                                   pid_namespace=identity.pid_namespace, pid=identity.pid,
                                   gpu_uuid=identity.gpu_uuid)


def identity_from_proto(message: decode_pb2.HostIdentity) -> HostIdentity:
    return HostIdentity(boot_id=message.boot_id, ipc_namespace=message.ipc_namespace,
                        pid_namespace=message.pid_namespace, pid=message.pid, gpu_uuid=message.gpu_uuid)


def tensor_to_proto(tensor: CudaIpcTensor) -> decode_pb2.CudaIpcTensor:
    return decode_pb2.CudaIpcTensor(
        handle=tensor.handle, storage_size_bytes=tensor.storage_size_bytes,
        storage_offset_bytes=tensor.storage_offset_bytes, ref_counter_handle=tensor.ref_counter_handle,
        ref_counter_offset=tensor.ref_counter_offset, event_handle=tensor.event_handle,
        event_sync_required=tensor.event_sync_required, shape=list(tensor.shape), stride=list(tensor.stride),
        offset=tensor.offset, dtype=tensor.dtype)


def tensor_from_proto(message: decode_pb2.CudaIpcTensor) -> CudaIpcTensor:
    return CudaIpcTensor(
        handle=message.handle, storage_size_bytes=message.storage_size_bytes,
        storage_offset_bytes=message.storage_offset_bytes, ref_counter_handle=message.ref_counter_handle,
        ref_counter_offset=message.ref_counter_offset, event_handle=message.event_handle,
        event_sync_required=message.event_sync_required, shape=tuple(message.shape), stride=tuple(message.stride),
        offset=message.offset, dtype=message.dtype)


def offer_to_proto(offer: IpcOffer) -> decode_pb2.KVIpcOffer:
    return decode_pb2.KVIpcOffer(session_id=offer.session_id, identity=identity_to_proto(offer.identity),
                                 layout=kv_layout(offer.layout), pool=tensor_to_proto(offer.pool),
                                 probe=tensor_to_proto(offer.probe), probe_nonce=offer.probe_nonce)


def offer_from_proto(message: decode_pb2.KVIpcOffer) -> IpcOffer:
    return IpcOffer(session_id=message.session_id, identity=identity_from_proto(message.identity),
                    layout=layout_from_proto(message.layout), pool=tensor_from_proto(message.pool),
                    probe=tensor_from_proto(message.probe), probe_nonce=message.probe_nonce)


def answer_to_proto(answer: IpcAnswer) -> decode_pb2.KVIpcAnswer:
    return decode_pb2.KVIpcAnswer(accepted=answer.accepted, reason=answer.reason, probe_digest=answer.probe_digest)


def answer_from_proto(message: decode_pb2.KVIpcAnswer) -> IpcAnswer:
    return IpcAnswer(accepted=message.accepted, reason=message.reason, probe_digest=message.probe_digest)
