"""A model's configuration without its tensors, for processes that only tokenize and route (the gateway):
torch-free, like everything it imports."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import eos_ids
from services.engine.model.registry import config_from_hf


def model_kind(path: Path) -> str:
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    raise ModelLoadError(f"{path}: expected a .gguf file or a directory with config.json and *.safetensors")


def load_model_config(path: str | Path, digest: str = "") -> ModelConfig:
    """The model's configuration without its tensors (for processes that only tokenize and route; ``digest``: the
    weight files', when the caller has it: a GGUF file's config may come from the weights cache, named by it)."""
    path = Path(path)
    if model_kind(path) == "gguf":
        from services.engine.weights.gguf_cache_config import cached_config
        from services.engine.weights.gguf_metadata import read_gguf_config

        return cached_config(path, lambda: read_gguf_config(path), digest)
    return hf_dir_config(path)


_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _special_float(obj: dict) -> object:
    """transformers writes an infinite or NaN float as ``{"__float__": "Infinity"}`` (Granite 4.0's
    ``time_step_limit``): read back as the float."""
    if obj.keys() == {"__float__"} and isinstance(obj["__float__"], str) and obj["__float__"] in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[obj["__float__"]]
    return obj


def read_hf_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text(), object_hook=_special_float)
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path / 'config.json'}: not valid JSON ({exc})") from exc


def hf_dir_config(path: Path) -> ModelConfig:
    """``config.json``'s model, with every EOS id ``generation_config.json`` adds (Llama 3 Instruct ends turns
    with ids its ``config.json`` does not list)."""
    config = config_from_hf(read_hf_config(path))
    generation = path / "generation_config.json"
    if not generation.is_file():
        return config
    try:
        extra = eos_ids(json.loads(generation.read_text()).get("eos_token_id"))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{generation}: unreadable ({exc})") from exc
    merged = tuple(dict.fromkeys((*config.eos_token_ids, *extra)))
    return dataclasses.replace(config, eos_token_ids=merged)
