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
    Mamba2,
    ModelConfig,
    MoEConfig,
    Multipliers,
    ShortConv,
)
from services.engine.model.gemma4_config import Gemma4Config
from services.engine.model.llama4 import Llama4Attention
from services.engine.weights.digest import weights_digest

CACHE_DIR_VARIABLE = "PDSERVE_WEIGHTS_CACHE_DIR"
VERSION = 4  # of the entry's layout; bumped when it or the loader's output changes


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


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """The inverse of ``dataclasses.asdict`` on a :class:`ModelConfig` (JSON lists back to tuples)."""
    data = dict(data)
    data["eos_token_ids"] = tuple(data["eos_token_ids"])
    if data.get("rope_scaling") is not None:
        rope = dict(data["rope_scaling"])
        for key in ("freq_factors", "short_factor"):
            if rope.get(key) is not None:
                rope[key] = tuple(rope[key])
        data["rope_scaling"] = RopeScaling(**rope)
    if data.get("moe") is not None:
        data["moe"] = MoEConfig(**{**data["moe"], "sparse_layers": tuple(data["moe"]["sparse_layers"])})
    data["layer_windows"] = tuple(data.get("layer_windows") or ())
    data["nope_layers"] = tuple(data.get("nope_layers") or ())
    data["chunked_layers"] = tuple(data.get("chunked_layers") or ())
    data["local_rope_layers"] = tuple(data.get("local_rope_layers") or ())
    if data.get("gemma") is not None:
        data["gemma"] = GemmaConfig(**data["gemma"])
    if data.get("multipliers") is not None:
        data["multipliers"] = Multipliers(**data["multipliers"])
    if data.get("mla") is not None:
        data["mla"] = LatentAttention(**data["mla"])
    if data.get("llama4") is not None:
        data["llama4"] = Llama4Attention(**data["llama4"])
    if data.get("gemma4") is not None:
        g = dict(data["gemma4"])
        g["layer_heads"] = tuple(tuple(heads) for heads in g["layer_heads"])
        for key in ("kv_sources", "value_is_key", "double_wide_layers"):
            g[key] = tuple(g[key])
        data["gemma4"] = Gemma4Config(**g)
    data["block_kinds"] = tuple(data.get("block_kinds") or ())
    for key, spec in (("linear_attention", LinearAttention), ("mamba", Mamba2), ("short_conv", ShortConv)):
        if data.get(key) is not None:
            data[key] = spec(**{**data[key], "layers": tuple(data[key]["layers"])})
    return ModelConfig(**data)
