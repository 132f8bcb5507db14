"""``make bench-pd``: the disaggregated path's own costs, on loopback with the bundled model (bf16).

1. KV stream throughput: this process plays the prefill node's sender (the same ``KVSender`` the prefill
   node uses, over mTLS with a prefill certificate of a throwaway CA) against a real decode-node process:
   reserve a 4096-token prompt, stream all its blocks in 4 MiB ``TransferKV`` messages, wait for every
   acknowledgement, abort; repeated. (``make bench-mtls`` compares mTLS with plaintext: ``bench.mtls``.)
2. TTFT of a 512-token prompt: through gateway → prefill → decode processes, versus the mixed engine in
   this process (same thread count), alternating, each prompt fresh (no prefix hits). The time to move
   that prompt's KV is measured alongside, since the prefill node streams it while computing.

Medians of ``--repeats`` runs are printed as a Markdown table and written to ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable

import grpc
import torch
from pdserve.v1 import decode_pb2, decode_pb2_grpc, gateway_pb2, gateway_pb2_grpc, node_pb2

from services.bench.security import bench_ca
from services.cluster.local import ClusterSpec, start_cluster
from services.common.launch import launch
from services.common.server import grpc_options
from services.common.tls.channels import open_channel
from services.common.tls.identity import Identity


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(100, 49000, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


async def kv_stream_once(address: str, layout: node_pb2.KVLayout, seed: int, tokens: int,
                         identity: Identity | None,
                         on_window: Callable[[bool], None] | None = None) -> tuple[int, float]:
    """Reserve, stream and commit one prompt's KV on the decode node at ``address`` as a prefill node does,
    calling with ``identity`` (a prefill certificate; None: plaintext); (bytes moved, seconds).
    ``on_window`` is told True as the timed stream starts and False as it ends (e.g. to read CPU times)."""
    from services.prefill_node.kv_sender import KVSender

    async with open_channel(address, "decode", grpc_options(), identity=identity) as channel:
        stub = decode_pb2_grpc.DecodeNodeStub(channel)
        request_id = f"bench-{seed}"
        grant = await stub.Reserve(decode_pb2.ReserveRequest(
            request_id=request_id, prompt_token_ids=_prompt(seed, tokens), max_tokens=1,
            sampling=gateway_pb2.SamplingParams(max_tokens=1, temperature=0),
            model_fingerprint=layout.model_fingerprint))
        assert grant.granted, grant.reason
        count = len(grant.block_ids)
        payload = os.urandom(layout.bytes_per_block * count)
        sender = KVSender(stub, request_id, layout, list(grant.block_ids), address, grant_token=grant.grant_token)
        if on_window is not None:
            on_window(True)
        started = time.perf_counter()
        await sender.open()
        await sender.send_blocks(0, count, payload, 4 << 20)
        await sender.commit(first_token_id=0, num_computed_tokens=tokens)
        elapsed = time.perf_counter() - started
        if on_window is not None:
            on_window(False)
        await sender.close()
        await stub.Abort(node_pb2.AbortRequest(request_id=request_id, grant_token=grant.grant_token))
        return len(payload), elapsed


def kv_layout_of(dtype: str) -> node_pb2.KVLayout:
    """The bundled model's KV layout in ``dtype`` (what a decode node of it expects)."""
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine
    from services.engine.model_files import bundled_model_path
    from services.engine_node.kv_layout import kv_layout

    engine = LLMEngine.from_config(EngineConfig(model_path=str(bundled_model_path()), dtype=dtype, num_kv_blocks=8))
    return kv_layout(engine.kv_layout_spec())


def bench_kv_stream(args: argparse.Namespace) -> dict[str, float]:
    layout = kv_layout_of(args.dtype)
    node_args = ("--dtype", args.dtype, "--threads", "1", "--num-kv-blocks", "1024")
    with bench_ca() as ca, launch("services.decode_node", *node_args, *ca.node_args("decode"), startup_timeout_s=120,
                                  stderr=subprocess.DEVNULL, identity=ca.identity("prefill")) as decode:
        prefill = ca.identity("prefill")  # this process streams as a prefill node does (mTLS, the default)
        asyncio.run(kv_stream_once(decode.address, layout, 0, 1024, prefill))  # warm-up
        runs = [asyncio.run(kv_stream_once(decode.address, layout, seed, 4096, prefill))
                for seed in range(1, args.repeats + 1)]
    rates = [size / seconds / 1e9 for size, seconds in runs]
    return {"kv_bytes_per_run": runs[0][0], "kv_stream_gb_per_s": statistics.median(rates),
            "kv_seconds_per_4k_prompt": statistics.median(s for _, s in runs), "runs_gb_per_s": rates}


def bench_ttft(args: argparse.Namespace) -> dict[str, float]:
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine
    from services.engine.model_files import bundled_model_path
    from services.engine.sampling_params import SamplingParams

    torch.set_num_threads(args.threads)
    mixed = LLMEngine.from_config(EngineConfig(model_path=str(bundled_model_path()), dtype=args.dtype))

    def mixed_ttft(seed: int) -> float:
        mixed.add_request(sampling=SamplingParams(max_tokens=1, temperature=0), token_ids=_prompt(seed, 512))
        started = time.perf_counter()
        while mixed.has_unfinished():
            mixed.step()
        return time.perf_counter() - started

    spec = ClusterSpec(cache_store=False, prefill_args=("--threads", str(args.threads)),
                       decode_args=("--threads", "1"), engine_args=("--dtype", args.dtype))
    pd, mx = [], []
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster, grpc.insecure_channel(cluster.address) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)

        def pd_ttft(seed: int) -> float:
            request = gateway_pb2.GenerateRequest(token_ids=_prompt(seed, 512),
                                                  sampling=gateway_pb2.SamplingParams(max_tokens=2, temperature=0))
            started = time.perf_counter()
            stream = stub.Generate(request, timeout=60)
            next(stream)
            first = time.perf_counter() - started
            for _ in stream:
                pass
            return first

        for r in range(3):  # warm-up (oneDNN builds its kernels for each new shape)
            pd_ttft(10_000 + r), mixed_ttft(11_000 + r)
        for r in range(args.repeats):
            time.sleep(0.3)  # let the decode node finish the previous request: it shares the cores
            pd.append(pd_ttft(20_000 + r))
            time.sleep(0.3)
            mx.append(mixed_ttft(30_000 + r))
    return {"ttft_pd_s": statistics.median(pd), "ttft_mixed_s": statistics.median(mx), "runs_pd": pd, "runs_mixed": mx}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the prefill node and mixed engine")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default="out/bench-pd.json")
    args = parser.parse_args(argv)
    kv = bench_kv_stream(args)
    ttft = bench_ttft(args)
    print(f"dtype={args.dtype}, prefill threads={args.threads}, medians of {args.repeats} runs\n")
    print("| measure | value |\n| --- | --- |")
    print(f"| KV stream P→D, 4096-token prompt ({kv['kv_bytes_per_run'] / 2**20:.0f} MiB) | "
          f"{kv['kv_stream_gb_per_s']:.2f} GB/s |")
    transfer_512 = kv["kv_seconds_per_4k_prompt"] / 8
    print(f"| KV transfer time of a 512-token prompt (at that rate) | {transfer_512 * 1000:.1f} ms |")
    print(f"| TTFT 512 tokens, mixed engine | {ttft['ttft_mixed_s'] * 1000:.0f} ms |")
    print(f"| TTFT 512 tokens, gateway → prefill → decode | {ttft['ttft_pd_s'] * 1000:.0f} ms |")
    overhead = ttft["ttft_pd_s"] - ttft["ttft_mixed_s"]
    print(f"| PD − mixed | {overhead * 1000:.0f} ms (budget: transfer + 10% = "
          f"{(transfer_512 + 0.1 * ttft['ttft_mixed_s']) * 1000:.0f} ms) |")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"args": vars(args), **kv, **ttft}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
