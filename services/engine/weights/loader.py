"""Dispatch on the model path: a ``.gguf`` file or a directory with ``config.json`` and safetensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels.int4_linear import GroupQuantized
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig


@dataclass(frozen=True)
class LoadedWeights:
    """A model's configuration and its tensors under Hugging Face names (a GGUF file's dequantised to
    float32, a safetensors checkpoint's in their stored dtype).

    ``quantized`` holds, under the same names, the file's own 4-bit codes of the tensors it stores as
    GGUF Q4_0/Q4_1 (``tensors`` holds their float32 dequantisation too).
    """

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    source: Path
    quantized: dict[str, GroupQuantized] = field(default_factory=dict)


def _model_kind(path: Path) -> str:
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    raise ModelLoadError(f"{path}: expected a .gguf file or a directory with config.json and *.safetensors")


def load_weights(path: str | Path, keep_q4: bool = False) -> LoadedWeights:
    """``keep_q4``: also decode a GGUF file's Q4 tensors into ``quantized`` (a model that will use them)."""
    path = Path(path)
    if _model_kind(path) == "gguf":
        from services.engine.weights.gguf_cache import cached
        from services.engine.weights.gguf_loader import load_gguf

        return cached(path, keep_q4, lambda keep: load_gguf(path, keep))
    from services.engine.weights.safetensors_loader import load_safetensors_dir

    return load_safetensors_dir(path)


def load_model_config(path: str | Path) -> ModelConfig:
    """The model's configuration without its tensors (for processes that only tokenize and route)."""
    path = Path(path)
    if _model_kind(path) == "gguf":
        from services.engine.weights.gguf_cache import cached_config
        from services.engine.weights.gguf_loader import read_gguf_config

        return cached_config(path, lambda: read_gguf_config(path))
    from services.engine.weights.safetensors_loader import hf_dir_config

    return hf_dir_config(path)
