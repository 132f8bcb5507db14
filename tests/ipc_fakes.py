"""CUDA IPC stood in for within one CPU process: "exporting" a tensor registers it under a handle and
"opening" the handle returns that same tensor, so the handshake, the block copies and the fallbacks of
the prefill and decode nodes run in CPU tests. Identities say "same host, same GPU, two processes"."""

from __future__ import annotations

import dataclasses
import os

import torch
from pdserve.v1 import node_pb2

from kvcache.cuda_ipc import DTYPES, CudaIpcTensor, IpcError, make_probe
from kvcache.host_identity import HostIdentity
from services.engine_node.kv_ipc_wire import IpcOffer
from services.prefill_node.kv_ipc import PoolExport

PREFILL_ID = HostIdentity(boot_id="b00t", ipc_namespace="ipc:[1]", pid_namespace="pid:[1]", pid=1000,
                          gpu_uuid="GPU-test")
DECODE_ID = dataclasses.replace(PREFILL_ID, pid=2000)


class FakeIpc:
    def __init__(self) -> None:
        self.tensors: dict[bytes, torch.Tensor] = {}
        self.opened = 0

    def export(self, tensor: torch.Tensor) -> CudaIpcTensor:
        handle = os.urandom(8)
        self.tensors[handle] = tensor
        dtype = next(name for name, d in DTYPES.items() if d == tensor.dtype)
        return CudaIpcTensor(handle=handle, storage_size_bytes=tensor.numel() * tensor.element_size(),
                             storage_offset_bytes=0, ref_counter_handle=b"", ref_counter_offset=0, event_handle=b"",
                             event_sync_required=False, shape=tuple(tensor.shape), stride=tuple(tensor.stride()),
                             offset=0, dtype=dtype)

    def open(self, exported: CudaIpcTensor, device: torch.device) -> torch.Tensor:
        self.opened += 1
        if exported.handle not in self.tensors:
            raise IpcError("cannot map the peer's memory: invalid handle")
        return self.tensors[exported.handle]

    def pool_export(self, pool: torch.Tensor, layout: node_pb2.KVLayout, identity: HostIdentity = PREFILL_ID,
                    session_id: str = "session-1") -> PoolExport:
        nonce = os.urandom(16)
        probe = make_probe(nonce, pool.device)
        offer = IpcOffer(session_id=session_id, identity=identity, layout=layout, pool=self.export(pool),
                         probe=self.export(probe), probe_nonce=nonce)
        return PoolExport(offer, probe)
