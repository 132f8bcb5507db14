"""The control plane imports without torch, numpy or grpc.

The KV-cache bookkeeping (every ``kvcache`` module but the tensor-holding ``kv_bytes`` and ``cuda_ipc``) and
the engine's scheduling half (scheduler, admission, reservations, requests, sampling settings, outputs and
what they import) are plain Python, so that a process without an accelerator stack can plan, admit and
account. Each module is imported in a fresh interpreter behind a ``sys.meta_path`` finder that refuses
``torch``, ``numpy`` and ``grpc`` (and their submodules); a test checks that the finder really refuses them,
so the others cannot pass for want of a blocker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("torch", "numpy", "grpc")
TENSOR_HOLDING_KVCACHE = {"kv_bytes", "cuda_ipc"}

KVCACHE_MODULES = ["kvcache", *sorted(
    f"kvcache.{path.stem}" for path in (ROOT / "kvcache").glob("*.py")
    if path.stem != "__init__" and path.stem not in TENSOR_HOLDING_KVCACHE
)]
ENGINE_MODULES = [f"services.engine.{name}" for name in (
    "scheduler", "admission", "reservations", "request", "sampling_params", "outputs",
    "step_batch", "logprobs", "reserve_waiters", "errors",
)]

# Runs in the child: refuse the blocked packages before anything else is imported.
BLOCKER = f"""
import importlib.abc, sys

BLOCKED = {BLOCKED!r}
assert not any(name.split(".")[0] in BLOCKED for name in sys.modules), "already imported at start-up"


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: the control plane must not import it")
        return None


sys.meta_path.insert(0, Blocker())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", BLOCKER + code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("module", ["torch", "torch.nn", "numpy", "numpy.linalg", "grpc", "grpc.aio"])
def test_the_blocker_blocks(module):
    result = _run(f"""
try:
    import {module}
except ImportError:
    print("blocked")
else:
    print("imported")
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "blocked"


@pytest.mark.parametrize("module", KVCACHE_MODULES + ENGINE_MODULES)
def test_imports_without_torch_numpy_grpc(module):
    result = _run(f"""
import importlib
importlib.import_module({module!r})
leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
assert not leaked, leaked
""")
    assert result.returncode == 0, f"{module} needs a blocked package:\n{result.stderr}"


def test_kvcache_package_leaves_the_tensor_modules_out():
    result = _run(f"""
import kvcache
loaded = sorted(name for name in sys.modules if name.removeprefix("kvcache.") in {sorted(TENSOR_HOLDING_KVCACHE)!r})
assert not loaded, loaded
""")
    assert result.returncode == 0, result.stderr


def test_the_list_covers_the_control_plane():
    """The kvcache list is found, not written: a new kvcache module is checked unless it holds tensors."""
    assert {"kvcache.manager", "kvcache.block_pool", "kvcache.hashing"} <= set(KVCACHE_MODULES)
    assert not {f"kvcache.{name}" for name in TENSOR_HOLDING_KVCACHE} & set(KVCACHE_MODULES)
