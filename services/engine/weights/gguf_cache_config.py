"""Where the GGUF weights cache (:mod:`services.engine.weights.gguf_cache`) keeps its entries, and the model
configuration an entry records: torch-free, so that a process that only reads the configuration (the gateway)
takes it from an entry without loading torch."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import safe_open

from kernels.rope_scaling import RopeScaling
from services.engine.model.config import (
    GemmaConfig,
    LatentAttention,
    LinearAttention,
    Mamba1,
    Mamba2,
    MiMoAttention,
    ModelConfig,
    MoEConfig,
    Multipliers,
    ShortConv,
    SparseIndex,
)
from services.engine.model.falcon_h1 import FalconH1Scales
from services.engine.model.gemma4_config import Gemma4Config
from services.engine.model.llama4 import Llama4Attention
from services.engine.weights.digest import weights_digest

CACHE_DIR_VARIABLE = "PDSERVE_WEIGHTS_CACHE_DIR"
VERSION = 5  # of the entry's layout; bumped when it or the loader's output changes


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_DIR_VARIABLE, "")
    return Path(value) if value else None


def entry_path(directory: Path, path: Path, digest: str = "") -> Path:
    """Named by the file's bytes (``digest``, else :func:`weights_digest`: a file rewritten in place gets a new
    entry)."""
    return directory / f"{digest or weights_digest(path)}-v{VERSION}.safetensors"


def cached_config(path: Path, read: Callable[[], ModelConfig], digest: str = "") -> ModelConfig:
    """The configuration from a cache entry's metadata when there is one, else ``read()`` (``digest``: the file's,
    when the caller has it)."""
    directory = cache_dir()
    entry = entry_path(directory, path, digest) if directory is not None else None
    if entry is not None and entry.is_file():
        with contextlib.suppress(Exception), safe_open(str(entry), "numpy") as file:
            return config_from_dict(json.loads(file.metadata()["pdserve"])["config"])
    return read()


# ModelConfig's fields that hold a dataclass, and its class (LatentAttention's ``index`` too: _NESTED_IN)
_NESTED: dict[str, type] = {
    "rope_scaling": RopeScaling, "moe": MoEConfig, "gemma": GemmaConfig, "multipliers": Multipliers,
    "mla": LatentAttention, "llama4": Llama4Attention, "gemma4": Gemma4Config, "mimo": MiMoAttention,
    "linear_attention": LinearAttention, "mamba": Mamba2, "short_conv": ShortConv, "mamba1": Mamba1,
    "falcon_h1": FalconH1Scales}
_NESTED_IN: dict[type, dict[str, type]] = {LatentAttention: {"index": SparseIndex}}


def _tuples(value: Any) -> Any:
    """JSON's lists back to the tuples every config field holds (nested ones too)."""
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value


def _rebuilt(cls: type, data: dict[str, Any]) -> Any:
    fields = {key: _tuples(value) for key, value in data.items()}
    for key, inner in _NESTED_IN.get(cls, {}).items():
        if fields.get(key) is not None:
            fields[key] = _rebuilt(inner, fields[key])
    return cls(**fields)


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """The inverse of ``dataclasses.asdict`` on a :class:`ModelConfig` (JSON lists back to tuples, each nested
    dataclass rebuilt as its class)."""
    fields = {key: _tuples(value) for key, value in data.items()}
    for key, cls in _NESTED.items():
        if data.get(key) is not None:
            fields[key] = _rebuilt(cls, data[key])
    return ModelConfig(**fields)
