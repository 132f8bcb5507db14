"""NativeCpuAttention (the C decode kernel plus torch for the rest) against the float64 oracle, on
garbage-filled caches with permuted blocks; and its build, availability and fallback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from paged_attention_oracle import TOLERANCE, check_forward_contract, make_sequences, oracle

from kernels.attention import BackendUnavailableError, TorchPagedAttention, available_backends, create_backend
from kernels.attention import registry as registry_module
from kernels.attention.native import build
from kernels.attention.native_cpu import NativeCpuAttention

try:
    build.load_library()
except build.NativeBuildError as exc:
    pytest.skip(f"native attention kernel unavailable here: {exc}", allow_module_level=True)

GQA = [(4, 4), (9, 3), (8, 2)]  # (query heads, KV heads): ratios 1, 3, 4
DTYPES = [torch.float32, torch.bfloat16]
HEAD_DIMS = [64, 16]  # 64: the AVX-512 tiles where the CPU has them; 16: the portable loop


@pytest.fixture(autouse=True)
def restore_registry() -> Iterator[None]:
    saved = dict(registry_module._registry)
    yield
    registry_module._registry.clear()
    registry_module._registry.update(saved)


def run_step(
    query_lens: list[int],
    seq_lens: list[int],
    heads: tuple[int, int],
    dtype: torch.dtype,
    head_dim: int = 64,
    block_size: int = 16,
    seed: int = 0,
) -> NativeCpuAttention:
    """One step over fresh sequences: the output matches the oracle, the new K/V land in their slots."""
    num_heads, num_kv_heads = heads
    context = [s - q for q, s in zip(query_lens, seq_lens, strict=True)]
    seqs = make_sequences(seq_lens, context, num_kv_heads, head_dim, block_size, dtype, seed)
    meta, q, k, v = seqs.step(query_lens, seq_lens, num_heads, seed + 1)
    backend = NativeCpuAttention("cpu")
    backend.plan(meta)
    scale = head_dim**-0.5
    out = backend.forward(q, k, v, seqs.cache, scale)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    expected = oracle(q, seqs, query_lens, seq_lens, scale)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)
    slots = meta.slot_mapping
    blocks, offsets = slots // block_size, slots % block_size
    assert torch.equal(seqs.cache[blocks, 0, offsets], k)
    assert torch.equal(seqs.cache[blocks, 1, offsets], v)
    return backend


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_batched_decode(heads: tuple[int, int], dtype: torch.dtype, head_dim: int) -> None:
    lens = [1, 17, 16, 33, 100, 4, 5, 15, 47]
    run_step([1] * len(lens), lens, heads, dtype, head_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 4), (64, 32), (128, 16), (96, 16), (32, 8), (48, 16)])
def test_decode_shapes(dtype: torch.dtype, head_dim: int, block_size: int) -> None:
    """Blocks smaller than, equal to and larger than a 16-slot tile; head dims on each inner loop."""
    lens = [1, 3, 31, 64, 65, 130]
    run_step([1] * len(lens), lens, (9, 3), dtype, head_dim, block_size)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens", [[700], [300, 5], [513, 256, 1000]])
def test_few_long_sequences_split_kv(lens: list[int], dtype: torch.dtype, threads: int) -> None:
    """Fewer sequences than twice the threads: the kernel splits their blocks and merges the parts."""
    torch.set_num_threads(threads)
    run_step([1] * len(lens), lens, (9, 3), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_many_sequences_two_threads(dtype: torch.dtype) -> None:
    torch.set_num_threads(2)
    lens = [16 * i + (i % 7) + 1 for i in range(40)]
    run_step([1] * len(lens), lens, (9, 3), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_peaked_scores_stay_finite(dtype: torch.dtype) -> None:
    """Large logits (sharp softmax, max moving between tiles) keep the online softmax exact."""
    seqs = make_sequences([90, 40], [89, 39], 3, 64, 16, dtype, seed=2)
    meta, q, k, v = seqs.step([1, 1], [90, 40], 9, seed=3)
    q = (q.float() * 8).to(dtype)
    backend = NativeCpuAttention("cpu")
    backend.plan(meta)
    out = backend.forward(q, k, v, seqs.cache, 0.5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), oracle(q, seqs, [1, 1], [90, 40], 0.5), atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_mixed_batch(heads: tuple[int, int], dtype: torch.dtype, head_dim: int) -> None:
    """Decode, prefill from scratch and prefill after a prefix interleaved in one step."""
    run_step([1, 12, 1, 20, 1, 6, 1], [9, 12, 30, 30, 2, 6, 70], heads, dtype, head_dim)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_only(dtype: torch.dtype) -> None:
    run_step([37], [37], (9, 3), dtype)
    run_step([5, 20], [5, 50], (9, 3), dtype, seed=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_prefill_then_decode(dtype: torch.dtype) -> None:
    """Steps on one cache, each reading what earlier steps wrote; the plan changes every step."""
    seqs = make_sequences([70, 24], [0, 0], 3, 64, 16, dtype, seed=3)
    backend = NativeCpuAttention("cpu")
    schedule = [([25, 10], [25, 10]), ([25, 13], [50, 23]), ([19, 1], [69, 24]), ([1, 1], [70, 24])]
    for step, (query_lens, seq_lens) in enumerate(schedule):
        meta, q, k, v = seqs.step(query_lens, seq_lens, 9, seed=10 + step)
        backend.plan(meta)
        out = backend.forward(q, k, v, seqs.cache, 0.3)
        expected = oracle(q, seqs, query_lens, seq_lens, 0.3)
        torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)


def test_layers_share_one_plan() -> None:
    first = make_sequences([30, 7, 50], [29, 6, 49], 3, 64, 16, torch.float32, seed=5)
    second = make_sequences([30, 7, 50], [29, 6, 49], 3, 64, 16, torch.float32, seed=6, tables=first.tables)
    backend = NativeCpuAttention("cpu")
    meta, q, _, _ = first.step([1, 1, 1], [30, 7, 50], 9, seed=7)
    backend.plan(meta)
    for layer in (first, second):
        _, _, k, v = layer.step([1, 1, 1], [30, 7, 50], 9, seed=7)
        out = backend.forward(q, k, v, layer.cache, 0.25)
        torch.testing.assert_close(out.double(), oracle(q, layer, [1, 1, 1], [30, 7, 50], 0.25), atol=2e-5, rtol=0)


def test_strided_q_and_int64_block_tables() -> None:
    """q/k/v as views of a fused projection, block tables handed over as int64."""
    lens = [5 + 3 * i for i in range(12)]
    seqs = make_sequences(lens, [n - 1 for n in lens], 3, 64, 16, torch.float32, seed=4)
    meta, q, k, v = seqs.step([1] * 12, lens, 9, seed=5)
    meta.block_tables = meta.block_tables.to(torch.int64)
    fused = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    q_view, k_view, v_view = (
        t.view(-1, n, 64) for t, n in zip(fused.split([9 * 64, 3 * 64, 3 * 64], dim=1), (9, 3, 3), strict=True)
    )
    assert not q_view.is_contiguous()
    backend = NativeCpuAttention("cpu")
    backend.plan(meta)
    out = backend.forward(q_view, k_view, v_view, seqs.cache, 0.25)
    torch.testing.assert_close(out.double(), oracle(q, seqs, [1] * 12, lens, 0.25), atol=2e-5, rtol=0)


def spy_on_torch(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Token counts of the forwards that went to the torch backend."""
    calls: list[int] = []
    original = TorchPagedAttention.forward

    def forward(self: TorchPagedAttention, q: torch.Tensor, *args: object, **options: object) -> torch.Tensor:
        calls.append(q.shape[0])
        return original(self, q, *args, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(TorchPagedAttention, "forward", forward)
    return calls


def test_decode_runs_natively_and_prefill_on_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_on_torch(monkeypatch)
    run_step([1, 1, 1], [9, 30, 2], (9, 3), torch.float32)
    assert calls == []
    run_step([1, 12, 1, 5], [9, 12, 30, 30], (9, 3), torch.float32)
    assert calls == [17]


def test_strided_cache_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_on_torch(monkeypatch)
    seqs = make_sequences([9, 21], [8, 20], 3, 64, 16, torch.float32, seed=8)
    big = torch.zeros((seqs.cache.shape[0], 3, *seqs.cache.shape[1:]))
    big[:, 1] = seqs.cache
    seqs.cache = big[:, 1]
    meta, q, k, v = seqs.step([1, 1], [9, 21], 9, seed=9)
    backend = NativeCpuAttention("cpu")
    backend.plan(meta)
    out = backend.forward(q, k, v, seqs.cache, 0.25)
    torch.testing.assert_close(out.double(), oracle(q, seqs, [1, 1], [9, 21], 0.25), atol=2e-5, rtol=0)
    assert calls == [2]


def test_unsupported_dtype_and_group_fall_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_on_torch(monkeypatch)
    for dtype, heads in ((torch.float16, (9, 3)), (torch.float32, (130, 2))):  # fp16; 65 query heads per KV head
        seqs = make_sequences([9, 21], [8, 20], heads[1], 16, 16, dtype, seed=8)
        meta, q, k, v = seqs.step([1, 1], [9, 21], heads[0], seed=9)
        backend = NativeCpuAttention("cpu")
        backend.plan(meta)
        out = backend.forward(q, k, v, seqs.cache, 0.25)
        atol = 2e-3 if dtype == torch.float16 else 2e-5
        torch.testing.assert_close(out.double(), oracle(q, seqs, [1, 1], [9, 21], 0.25), atol=atol, rtol=0)
    assert calls == [2, 2]


def test_forward_checks() -> None:
    backend = NativeCpuAttention("cpu")
    check_forward_contract(backend, torch.float32, 64, 16)


def test_blocks_outside_the_cache_are_refused() -> None:
    seqs = make_sequences([20, 9], [19, 8], 3, 64, 16, torch.float32, seed=1)
    meta, q, k, v = seqs.step([1, 1], [20, 9], 9, seed=2)
    backend = NativeCpuAttention("cpu")
    backend.plan(meta)
    with pytest.raises(ValueError, match="uses block"):
        backend.forward(q, k, v, seqs.cache[: max(seqs.tables[0])], 0.25)


@pytest.mark.parametrize("extra_flags", [("-mno-avx512f",), ("-mno-avx512bf16",)], ids=["portable", "no-bf16-dot"])
def test_other_builds_of_the_kernel(
    extra_flags: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loops a CPU without AVX-512 (or without AVX512-BF16) compiles, checked on this one."""
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "FLAGS", build.FLAGS + extra_flags)
    for dtype in DTYPES:
        for head_dim in (64, 96, 16):
            run_step([1] * 5, [1, 16, 40, 77, 300], (9, 3), dtype, head_dim)
        run_step([1, 12, 1], [9, 12, 700], (8, 2), dtype)
    assert len(list((tmp_path / "native").glob("*.so"))) == 1


def test_concurrent_first_builds(tmp_path: Path) -> None:
    """Processes building at once each compile into a temporary file and rename it into place."""
    code = "from kernels.attention.native.build import load_library; load_library()"
    env = {**os.environ, "PDSERVE_CACHE_DIR": str(tmp_path)}
    root = Path(__file__).resolve().parents[2]
    processes = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=root) for _ in range(3)]
    assert [p.wait(timeout=120) for p in processes] == [0, 0, 0]
    assert [p.suffix for p in (tmp_path / "native").iterdir()] == [".so"]


def test_auto_picks_native_on_cpu() -> None:
    assert "cpu_native" in available_backends()
    assert isinstance(create_backend(None, "cpu"), NativeCpuAttention)
    assert isinstance(create_backend("auto", torch.device("cpu")), NativeCpuAttention)
    assert type(create_backend("torch", "cpu")) is TorchPagedAttention


def test_library_is_cached_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    library = build.load_library()
    built = list((tmp_path / "native").iterdir())
    assert [p.name for p in built] == [build.library_path(build.find_compiler()).name]
    mtime = built[0].stat().st_mtime_ns
    assert build.load_library() is library
    build._loaded.clear()
    build.load_library()
    assert built[0].stat().st_mtime_ns == mtime  # loaded again, not rebuilt


def test_missing_compiler_falls_back_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(BackendUnavailableError, match=r"'cpu_native' is unavailable.*no-such-cc"):
        create_backend("cpu_native", "cpu")
    assert "cpu_native" not in available_backends()
    assert type(create_backend("auto", "cpu")) is TorchPagedAttention


def test_compile_error_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = tmp_path / "broken-cc"
    compiler.write_text("#!/bin/sh\necho 'paged_decode.c:1: error: no luck today' >&2\nexit 1\n")
    compiler.chmod(compiler.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(compiler))
    with pytest.raises(BackendUnavailableError, match="no luck today"):
        create_backend("cpu_native", "cpu")
    assert type(create_backend(None, "cpu")) is TorchPagedAttention
    assert os.listdir(tmp_path / "cache" / "native") == []  # no half-written library left behind


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runs_torch() -> None:
    seqs = make_sequences([9, 21], [8, 12], 3, 64, 16, torch.float32, seed=1, device="cuda")
    meta, q, k, v = seqs.step([1, 9], [9, 21], 9, seed=2)
    backend = NativeCpuAttention("cuda")
    backend.plan(meta)
    out = backend.forward(q, k, v, seqs.cache, 0.25)
    torch.testing.assert_close(out.cpu().double(), oracle(q, seqs, [1, 9], [9, 21], 0.25), atol=2e-5, rtol=0)
