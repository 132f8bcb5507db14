"""Backend registry: names, lazy imports, auto selection."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kernels.attention import (
    AttentionBackend,
    BackendUnavailableError,
    TorchPagedAttention,
    UnknownBackendError,
    available_backends,
    create_backend,
    register_backend,
    registered_backends,
)
from kernels.attention import registry as registry_module


@pytest.fixture(autouse=True)
def restore_registry() -> Iterator[None]:
    saved = dict(registry_module._registry)
    yield
    registry_module._registry.clear()
    registry_module._registry.update(saved)


def test_cpu_gets_torch_by_name() -> None:
    backend = create_backend("torch", torch.device("cpu"))
    assert isinstance(backend, TorchPagedAttention)
    assert backend.name == "torch"


@pytest.mark.parametrize("name", [None, "auto"])
def test_auto_on_cpu_prefers_native_else_torch(
    name: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    expected = "cpu_native" if "cpu_native" in available_backends() else "torch"
    assert create_backend(name, torch.device("cpu")).name == expected
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "missing-cc"))
    assert "cpu_native" not in available_backends()
    backend = create_backend(name, "cpu")
    assert isinstance(backend, TorchPagedAttention) and backend.name == "torch"


def test_auto_on_cpu_never_imports_flashinfer() -> None:
    """In a fresh interpreter (other tests here import the backend module on purpose): auto on a CPU
    never looks at the flashinfer backend, and listing backends never imports the flashinfer package
    on a machine without CUDA."""
    code = ("import sys, torch; from kernels.attention import available_backends, create_backend; "
            "create_backend('auto', 'cpu'); "
            "assert 'kernels.attention.flashinfer' not in sys.modules and 'flashinfer' not in sys.modules; "
            "available_backends(); "
            "assert torch.cuda.is_available() or 'flashinfer' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.skipif(torch.cuda.is_available(), reason="flashinfer may be importable on a CUDA machine")
def test_flashinfer_unavailable_here_says_why() -> None:
    assert "flashinfer" in registered_backends()
    assert "flashinfer" not in available_backends()
    with pytest.raises(BackendUnavailableError, match=r"'flashinfer' is unavailable.*kernels\.attention\.flashinfer"):
        create_backend("flashinfer", "cpu")


def test_unknown_name() -> None:
    with pytest.raises(UnknownBackendError, match=r"unknown attention backend 'nope'.*torch"):
        create_backend("nope", "cpu")


def test_lazy_path_is_imported_on_first_use() -> None:
    register_backend("lazy-torch", "kernels.attention.torch_paged:TorchPagedAttention")
    assert registry_module._registry["lazy-torch"] == "kernels.attention.torch_paged:TorchPagedAttention"
    assert isinstance(create_backend("lazy-torch", "cpu"), TorchPagedAttention)
    assert "lazy-torch" in available_backends()


def test_register_factory_and_guards() -> None:
    made: list[torch.device] = []

    def factory(device: torch.device) -> AttentionBackend:
        made.append(device)
        return TorchPagedAttention(device, decode_impl="sdpa")

    register_backend("custom", factory)
    backend = create_backend("custom", "cpu")
    assert isinstance(backend, TorchPagedAttention) and backend.decode_impl == "sdpa"
    assert made == [torch.device("cpu")]
    with pytest.raises(ValueError, match="already registered"):
        register_backend("custom", factory)
    register_backend("custom", TorchPagedAttention, replace=True)
    with pytest.raises(ValueError, match="reserved"):
        register_backend("auto", factory)
    with pytest.raises(ValueError, match=r"package\.module:Attribute"):
        register_backend("bad", "kernels.attention.torch_paged")
    register_backend("missing", "pdserve_no_such_module:Backend")
    assert "missing" not in available_backends()
    with pytest.raises(BackendUnavailableError, match="pdserve_no_such_module"):
        create_backend("missing", "cpu")
