"""KV transfer of one prompt from a prefill node to a decode node on the same GPU: CUDA IPC vs the gRPC
byte stream (see ``gpu.suite``).

This process plays the prefill node (over mTLS, with a prefill certificate of a throwaway CA): an engine of
the same model on the GPU gives the KV pool and layout, and the prefill node's own ``KVSender`` sends to a
real decode-node process (``--device cuda``). Per run:
reserve a prompt of ``tokens`` tokens, move all its blocks, commit, wait for every acknowledgement, abort.
The byte stream's time includes reading the blocks out of the GPU pool (what the prefill node does per
chunk); the IPC time includes the decode node's device-to-device copies and their acknowledgements. The
IPC handshake (once per peer pair) is timed apart.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass

import torch
from pdserve.v1 import decode_pb2, decode_pb2_grpc, gateway_pb2, node_pb2

from kvcache.kv_bytes import read_blocks
from services.bench.security import bench_ca
from services.common.launch import launch
from services.common.server import grpc_options
from services.common.tls.channels import open_channel
from services.common.tls.identity import Identity
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine_node.kv_ipc_wire import answer_from_proto, offer_to_proto
from services.engine_node.kv_layout import kv_layout
from services.prefill_node.kv_ipc import IpcLinks, export_pool
from services.prefill_node.kv_sender import IpcRoute, KVSender
from services.prefill_node.node import MAX_MESSAGE_PAYLOAD


@dataclass(frozen=True)
class TransferResult:
    tokens: int
    bytes: int
    grpc_ms: float
    ipc_ms: float
    handshake_ms: float
    ipc_used: bool
    """False when the link fell back to bytes (then ipc_ms timed bytes too): see ``fallback``."""
    fallback: str

    @property
    def speedup(self) -> float:
        return self.grpc_ms / self.ipc_ms


async def _move(stub: decode_pb2_grpc.DecodeNodeStub, address: str, layout: node_pb2.KVLayout, pool: torch.Tensor,
                request_id: str, prompt: list[int], ipc: IpcRoute | None) -> tuple[float, bool]:
    grant = await stub.Reserve(decode_pb2.ReserveRequest(
        request_id=request_id, prompt_token_ids=prompt, max_tokens=1,
        sampling=gateway_pb2.SamplingParams(max_tokens=1, temperature=0), model_fingerprint=layout.model_fingerprint))
    assert grant.granted, grant.reason
    assert grant.num_cached_blocks == 0, "a fresh prompt should not hit the decode node's prefix cache"
    count = len(grant.block_ids)
    source = list(range(count))
    sender = KVSender(stub, request_id, layout, list(grant.block_ids), address, ipc=ipc,
                      grant_token=grant.grant_token)
    if pool.is_cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    await sender.open()
    if ipc is None:
        await sender.send_blocks(0, count, read_blocks(pool, source), MAX_MESSAGE_PAYLOAD)
    else:
        await sender.send_block_refs(0, source, MAX_MESSAGE_PAYLOAD)
    await sender.commit(first_token_id=0, num_computed_tokens=len(prompt))
    elapsed = time.perf_counter() - started
    await sender.close()
    await stub.Abort(node_pb2.AbortRequest(request_id=request_id, grant_token=grant.grant_token))
    return elapsed * 1e3, ipc is not None and sender.blocks_by_ipc == count


async def _bench(address: str, engine: LLMEngine, tokens: int, repeats: int, identity: Identity | None
                 ) -> TransferResult:
    layout, pool = kv_layout(engine.kv_layout_spec()), engine.kv_pool
    pool.normal_()  # bytes are bytes; random ones keep nothing compressible or cached
    gen = torch.Generator().manual_seed(0)
    async with open_channel(address, "decode", grpc_options(), identity=identity) as channel:
        stub = decode_pb2_grpc.DecodeNodeStub(channel)

        async def offer(peer: str, ipc_offer):
            return answer_from_proto(await stub.OpenKVIpc(offer_to_proto(ipc_offer), timeout=30))

        links = IpcLinks(lambda: export_pool(pool, layout), offer)
        started = time.perf_counter()
        session = await links.session_for(address)
        handshake_ms = (time.perf_counter() - started) * 1e3
        route = None if session is None else IpcRoute(session, lambda ids: read_blocks(pool, ids),
                                                      lambda reason: links.fail(address, reason))
        grpc_times, ipc_times, ipc_used = [], [], True
        for run in range(repeats + 1):  # run 0 warms both paths up
            prompts = torch.randint(10, engine.model.config.vocab_size - 10, (2, tokens), generator=gen).tolist()
            grpc_ms, _ = await _move(stub, address, layout, pool, f"bytes-{run}", prompts[0], None)
            ipc_ms, used = await _move(stub, address, layout, pool, f"ipc-{run}", prompts[1], route)
            ipc_used = ipc_used and used
            if run:
                grpc_times.append(grpc_ms)
                ipc_times.append(ipc_ms)
        link = links.links.get(address)
        return TransferResult(tokens, tokens * engine.model.config.kv_bytes_per_token(pool.element_size()),
                              statistics.median(grpc_times), statistics.median(ipc_times), handshake_ms,
                              ipc_used and session is not None, link.reason if link else "")


def transfer(model_path: str, tokens: int = 4096, repeats: int = 5, device: str = "cuda") -> TransferResult:
    """Start a decode node on ``device``, then time both paths against it (on a CPU both move bytes)."""
    blocks = str(2 * -(-tokens // 16) + 64)
    args = ("--model", model_path, "--device", device, "--dtype", "bfloat16", "--num-kv-blocks", blocks,
            "--kv-ipc", "auto", "--max-num-batched-tokens", "4096")
    engine = LLMEngine.from_config(EngineConfig(model_path=model_path, dtype="bfloat16", device=device,
                                                num_kv_blocks=int(blocks)))
    with bench_ca() as ca, launch("services.decode_node", *args, *ca.node_args("decode"), startup_timeout_s=300,
                                  stderr=subprocess.DEVNULL, identity=ca.identity("prefill")) as node:
        return asyncio.run(_bench(node.address, engine, tokens, repeats, ca.identity("prefill")))
