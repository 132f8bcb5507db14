"""Compile the FlashInfer JIT modules that pdserve runs, without a GPU (the child process of
``flashinfer_prebuild``; flashinfer must be importable and nvcc on the path).

    python -m services.bench.gpu.flashinfer_aot_build OUT.json

Builds, for ``FLASHINFER_CUDA_ARCH_LIST`` (set by the caller), the page module (``append_paged_kv_cache``)
and, per (dtype, head dim) in ``module_keys()``, the two fa2 batch-prefill modules that the tensor-core
``BatchDecodeWithPagedKVCacheWrapper`` (and ``BatchPrefillWithPagedKVCacheWrapper(backend="fa2")``) load,
and the fa3 (Hopper) batch-prefill module that ``BatchPrefillWithPagedKVCacheWrapper(backend="auto")``
loads on an H100/H200; and the modules of the decoder's fused ops (``kernels/fused_ops.py``: norm, rope,
silu_and_mul; each serves every dtype). Nothing is loaded (there is no driver here). Writes
``{module name: path of its .so}`` to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def module_keys() -> list[tuple[torch.dtype, int]]:
    """(dtype, head dim) of every FlashInfer module the backend runs: what the GPU bench and tests warm up
    (``services.bench.gpu.attention``: bf16 for the benchmark shapes, plus ``TEST_KERNELS``)."""
    from services.bench.gpu.attention import SHAPES, TEST_KERNELS

    keys = [(torch.bfloat16, shape.head_dim) for shape in SHAPES] + [(d, s.head_dim) for d, s in TEST_KERNELS]
    return list(dict.fromkeys(keys))


def module_specs() -> list:
    """FlashInfer's JitSpecs of those modules (the pinned flashinfer-python's own generators)."""
    from flashinfer.jit.activation import gen_act_and_mul_module
    from flashinfer.jit.attention import modules
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.page import gen_page_module
    from flashinfer.jit.rope import gen_rope_module

    specs = [gen_page_module(), gen_norm_module(), gen_rope_module(), gen_act_and_mul_module("silu")]
    for dtype, head_dim in module_keys():
        # The key get_batch_prefill_module gets from plan(): q, kv, o dtypes, index dtype, head dims qk/vo,
        # no positional encoding, no sliding window, no logits cap, no fp16 QK reduction.
        key = (dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False, False)
        specs.append(modules._gen_batch_prefill_primary_module("fa2", *key))
        specs.append(modules._gen_batch_prefill_independent_paged_module("fa2", *key))
        specs.append(modules.gen_batch_prefill_module("fa3", *key))
    return specs


def main() -> None:
    built = {}
    for spec in module_specs():
        started = time.perf_counter()
        spec.build()
        built[spec.name] = str(spec.get_library_path())
        print(f"built {spec.name} ({time.perf_counter() - started:.0f} s)", flush=True)
    Path(sys.argv[1]).write_text(json.dumps(built, indent=1))


if __name__ == "__main__":
    main()
