"""``make bench-cache-store``: a real cache-store process on loopback, driven by this one.

1. Memory tier: put and get throughput of ``--blocks`` blocks of ``--block-bytes`` (368,640 = one bf16
   block of the bundled model: 30 layers × K,V × 16 tokens × 3 heads × 64 × 2 bytes) in one call each,
   fresh keys every run (:class:`CacheStoreClient`); the memory tier holds two runs' blocks (or
   ``--lookup-keys`` blocks), so later puts evict as a full store does.
2. Lookup latency of one call naming ``--lookup-keys`` stored keys (median and p99 of 200 calls; the
   keys are of 4 KiB blocks, as lookup cost does not depend on block size).
3. Memory overhead per stored block: the server's RSS growth per put past its first three, minus the
   data bytes, divided by the blocks stored (median over the puts; and the fixed cost: the growth over
   a fresh start in those three puts, minus their data).
4. Disk tier (``--disk-write-through``, files under ``--disk-dir``): a put that answers once its blocks
   are on disk, and a get of the previous run's blocks, which memory no longer holds (read from files
   the page cache most likely still holds, verified, promoted).

The client calls as a prefill node does, over mTLS (certificates of a throwaway CA; ``--insecure``: plaintext).
Medians of ``--repeats`` runs are printed as a Markdown table and written to ``--json``. CPU seconds of
both processes per GB moved are reported alongside (on this 2-core machine the two share the cores).
The server tunes its malloc (``services.common.malloc.tune_malloc``, as the prefill and decode nodes do);
``--tune-client-malloc`` does the same in this process, to show what a client gains from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pdserve.v1 import node_pb2

from services.bench.security import acting_as, bench_ca
from services.cache_store.client import CacheStoreClient
from services.common.launch import ServiceProcess, launch
from services.common.malloc import tune_malloc

FINGERPRINT = b"bench-model\0\0\0\0\0"


def _layout(block_bytes: int) -> node_pb2.KVLayout:
    return node_pb2.KVLayout(dtype="bfloat16", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64,
                             model_fingerprint=FINGERPRINT, bytes_per_block=block_bytes)


def _keys(run: str, count: int) -> list[bytes]:
    return [FINGERPRINT + f"{run}:{i}".encode().ljust(16, b".")[:16] for i in range(count)]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise RuntimeError("no VmRSS")


@dataclass
class Series:
    """GB/s of each run, and the CPU seconds per GB of client and server."""

    rates: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)

    def time(self, pid: int, nbytes: int, call: Callable[[], object]) -> None:
        cpu, server, started = time.process_time(), _cpu_s(pid), time.perf_counter()
        call()
        elapsed = time.perf_counter() - started
        self.rates.append(nbytes / elapsed / 1e9)
        self.client_cpu.append((time.process_time() - cpu) / (nbytes / 1e9))
        self.server_cpu.append((_cpu_s(pid) - server) / (nbytes / 1e9))

    def medians(self) -> dict[str, float]:
        return {"gb_per_s": statistics.median(self.rates), "client_cpu_s_per_gb": statistics.median(self.client_cpu),
                "server_cpu_s_per_gb": statistics.median(self.server_cpu)}


@contextmanager
def _store(args: argparse.Namespace, *flags: str) -> Iterator[tuple[ServiceProcess, CacheStoreClient]]:
    """A cache-store process, and a client that calls it as a prefill node does: over mTLS with a certificate
    of a throwaway CA (``--insecure``: plaintext on both sides)."""
    with bench_ca(args.insecure) as ca, acting_as(ca.identity("prefill")), \
            launch("services.cache_store", "--log-level", "warning", *ca.node_args("cache-store"), *flags) as node:
        client = CacheStoreClient(node.address, timeout_s=120)
        try:
            yield node, client
        finally:
            client.close()


def bench_memory(args: argparse.Namespace, payload: bytes) -> dict[str, object]:
    size = args.block_bytes
    run_bytes = size * args.blocks
    capacity = size * args.blocks * 2  # from the third run on, puts evict
    put, get = Series(), Series()
    with _store(args, "--capacity-bytes", str(capacity)) as (node, client):
        client.layout = _layout(size)
        pid = node.process.pid
        for run in range(args.repeats + 1):  # the first run warms up
            keys = _keys(f"m{run}", args.blocks)
            blocks = [(key, memoryview(payload)[i * size:(i + 1) * size]) for i, key in enumerate(keys)]
            target = (put, get) if run else (Series(), Series())
            target[0].time(pid, run_bytes, lambda blocks=blocks: client.put(blocks))
            target[1].time(pid, run_bytes, lambda keys=keys: client.get(keys))
        # Lookup cost does not depend on block size: small blocks stand in for stored ones.
        client.layout = _layout(4096)
        lookup_keys = _keys("lookup", args.lookup_keys)
        client.put([(key, payload[:4096]) for key in lookup_keys])
        latencies = []
        for _ in range(200):
            started = time.perf_counter()
            hits = client.lookup(lookup_keys)
            latencies.append((time.perf_counter() - started) * 1e3)
            assert hits == len(lookup_keys), f"lookup found {hits} of {len(lookup_keys)}"
    latencies.sort()
    return {"put": put.medians(), "get": get.medians(), "lookup_keys": args.lookup_keys,
            "lookup_ms_median": statistics.median(latencies), "lookup_ms_p99": latencies[int(len(latencies) * 0.99)]}


def bench_overhead(args: argparse.Namespace, payload: bytes) -> dict[str, float]:
    """RSS growth of a fresh store: the first puts grow the buffers every put uses (fixed: three puts, as
    measured here); the puts after them show the cost of one more block (marginal: the median over those puts; the
    heap grows in steps, so single puts vary)."""
    size, batch, warm = args.block_bytes, args.blocks, 3
    count = max(args.overhead_blocks, (warm + 1) * batch)
    with _store(args, "--capacity-bytes", str(size * count * 2)) as (node, client):
        client.layout = _layout(size)
        rss = [_rss_bytes(node.process.pid)]
        for start in range(0, count, batch):
            keys = _keys(f"o{start}", min(batch, count - start))
            client.put([(key, memoryview(payload)[i * size:(i + 1) * size]) for i, key in enumerate(keys)])
            rss.append(_rss_bytes(node.process.pid))
    sizes = [min(batch, count - start) for start in range(0, count, batch)]
    marginal = [(rss[i + 1] - rss[i] - n * size) / n for i, n in enumerate(sizes) if i >= warm]
    later = sum(sizes[warm:])
    return {"blocks": count, "fixed_bytes": rss[warm] - rss[0] - warm * batch * size,
            "overhead_bytes_per_block": statistics.median(marginal),
            "overhead_bytes_per_block_mean": (rss[-1] - rss[warm] - later * size) / later}


def bench_disk(args: argparse.Namespace, payload: bytes) -> dict[str, object]:
    size = args.block_bytes
    run_bytes = size * args.blocks
    put, get = Series(), Series()
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-cs-", dir=args.disk_dir) as directory, _store(
        args, "--capacity-bytes", str(run_bytes), "--disk-dir", directory, "--disk-write-through",
        "--disk-capacity-bytes", str(run_bytes * (args.repeats + 3)),
    ) as (node, client):
        client.layout = _layout(size)
        pid = node.process.pid
        previous: list[bytes] = []
        for run in range(args.repeats + 2):  # two warm-up runs: the first has no previous run to get
            keys = _keys(f"d{run}", args.blocks)
            blocks = [(key, memoryview(payload)[i * size:(i + 1) * size]) for i, key in enumerate(keys)]
            target = (put, get) if run >= 2 else (Series(), Series())
            target[0].time(pid, run_bytes, lambda blocks=blocks: client.put(blocks))
            if previous:  # memory holds one run: the previous run is on disk only
                target[1].time(pid, run_bytes, lambda previous=previous: client.get(previous))
            previous = keys
    return {"put_write_through": put.medians(), "get_from_disk": get.medians()}


def _table(results: dict) -> str:
    memory, disk, overhead = results.get("memory"), results.get("disk"), results.get("overhead")
    rows = []
    if memory:
        rows += [("put, memory tier", memory["put"]), ("get, memory tier", memory["get"])]
    if disk:
        rows += [("put, disk write-through", disk["put_write_through"]), ("get, from disk", disk["get_from_disk"])]
    lines = ["| measure | GB/s | client CPU s/GB | server CPU s/GB |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {r['gb_per_s']:.2f} | {r['client_cpu_s_per_gb']:.2f} | {r['server_cpu_s_per_gb']:.2f} |"
              for name, r in rows]
    lines += ["", "| measure | value |", "| --- | --- |"]
    if memory:
        lines += [f"| lookup of {memory['lookup_keys']} stored keys, median | {memory['lookup_ms_median']:.2f} ms |",
                  f"| lookup of {memory['lookup_keys']} stored keys, p99 | {memory['lookup_ms_p99']:.2f} ms |"]
    if overhead:
        lines += [f"| memory overhead per stored block (marginal, {overhead['blocks']} blocks stored) | "
                  f"{overhead['overhead_bytes_per_block']:.0f} bytes |",
                  f"| memory overhead, fixed (buffers of puts in flight) | {overhead['fixed_bytes'] / 2**20:.1f} MiB |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.bench.cache_store", description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=256, help="blocks per put / get")
    parser.add_argument("--block-bytes", type=int, default=368_640, help="bytes per block (bundled model, bf16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lookup-keys", type=int, default=1000)
    parser.add_argument("--overhead-blocks", type=int, default=2048)
    parser.add_argument("--disk-dir", default=None, help="parent of the disk tier's temporary directory")
    parser.add_argument("--only", default="memory,overhead,disk", help="comma-separated parts to run")
    parser.add_argument("--tune-client-malloc", action="store_true",
                        help="tune this (the client's) process's malloc as the server tunes its own")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext store and client (default: mTLS, as a cluster runs)")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args(argv)
    if args.tune_client_malloc:
        tune_malloc()
    payload = os.urandom(args.block_bytes * args.blocks)
    parts = {"memory": bench_memory, "overhead": bench_overhead, "disk": bench_disk}
    results: dict[str, object] = {"args": vars(args)}
    for name in args.only.split(","):
        results[name] = parts[name](args, payload)
    print(_table(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
