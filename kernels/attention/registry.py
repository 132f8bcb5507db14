"""Attention backends by name; optional ones are imported only when asked for."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import torch

from kernels.attention.base import AttentionBackend
from kernels.attention.torch_paged import TorchPagedAttention

log = logging.getLogger(__name__)

BackendFactory = Callable[[torch.device], AttentionBackend]
"""Builds a backend for a device (a backend class taking the device as its first argument is one)."""

AUTO = "auto"


class UnknownBackendError(ValueError):
    """No backend is registered under the requested name."""


class BackendUnavailableError(RuntimeError):
    """The backend is registered but cannot run here (its module or a dependency fails to import)."""


_registry: dict[str, BackendFactory | str] = {}


def register_backend(name: str, factory: BackendFactory | str, *, replace: bool = False) -> None:
    """Register a backend under ``name``: a factory, or a lazy ``"package.module:Attribute"`` path that
    is imported the first time the backend is created (so optional dependencies stay unimported)."""
    if name == AUTO:
        raise ValueError(f"{AUTO!r} is reserved")
    if isinstance(factory, str) and ":" not in factory:
        raise ValueError(f"lazy backend path must look like 'package.module:Attribute', got {factory!r}")
    if name in _registry and not replace:
        raise ValueError(f"attention backend {name!r} is already registered")
    _registry[name] = factory


def registered_backends() -> list[str]:
    """Every registered name, importable here or not."""
    return sorted(_registry)


def available_backends() -> list[str]:
    """Registered names whose implementation imports on this install (CUDA is not checked)."""
    names = []
    for name in sorted(_registry):
        try:
            _resolve(name)
        except BackendUnavailableError:
            continue
        names.append(name)
    return names


def create_backend(name: str | None, device: torch.device | str) -> AttentionBackend:
    """Instantiate a backend for ``device``.

    ``None`` or ``"auto"`` picks ``"flashinfer"`` on a CUDA device when it imports, and
    ``"cpu_native"`` on a CPU device when its kernel builds here (flashinfer is then never imported);
    otherwise ``"torch"``. Raises ``UnknownBackendError`` for an unregistered name and
    ``BackendUnavailableError`` when the named backend cannot be imported or built.
    """
    device = torch.device(device)
    if name is None or name == AUTO:
        name = _pick_auto(device)
    return _resolve(name)(device)


AUTO_PREFERENCE = {"cuda": "flashinfer", "cpu": "cpu_native"}
"""The backend ``"auto"`` tries first on each device type, falling back to ``"torch"``."""


def _pick_auto(device: torch.device) -> str:
    preferred = AUTO_PREFERENCE.get(device.type)
    if preferred is not None and preferred in _registry:
        try:
            _resolve(preferred)
        except BackendUnavailableError as exc:
            log.info("attention backend auto: %s unavailable (%s), using torch", preferred, exc)
        else:
            return preferred
    return TorchPagedAttention.name


def _resolve(name: str) -> BackendFactory:
    try:
        factory = _registry[name]
    except KeyError:
        raise UnknownBackendError(
            f"unknown attention backend {name!r}; registered: {', '.join(registered_backends())}"
        ) from None
    if not isinstance(factory, str):
        _check_available(factory)
        return factory
    module_name, _, attribute = factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"attention backend {name!r} is unavailable: importing {module_name} failed ({exc}). "
            f"It needs its optional dependencies (for flashinfer: a CUDA machine and the 'gpu' extra, "
            f"pip install 'pdserve[gpu]'); the 'torch' backend works everywhere."
        ) from exc
    resolved: BackendFactory = getattr(module, attribute)
    _registry[name] = resolved
    _check_available(resolved)
    return resolved


def _check_available(factory: BackendFactory) -> None:
    """A factory may define ``check_available()``, raising ``BackendUnavailableError`` when it cannot
    run here although it imports (a native kernel that does not build, say)."""
    check = getattr(factory, "check_available", None)
    if check is not None:
        check()


register_backend(TorchPagedAttention.name, TorchPagedAttention)
register_backend("flashinfer", "kernels.attention.flashinfer:FlashInferBackend")
register_backend("cpu_native", "kernels.attention.native_cpu:NativeCpuAttention")
register_backend("cpu_fixed_order", "kernels.attention.fixed_order:FixedOrderCpuAttention")
