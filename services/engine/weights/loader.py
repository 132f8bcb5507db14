"""Dispatch on the model path: a ``.gguf`` file or a directory with ``config.json`` and safetensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from services.engine.model.config import ModelConfig
from services.engine.weights.model_config_reader import model_kind

if TYPE_CHECKING:  # the package's config half stays torch-free (the gateway imports it)
    import torch

    from kernels.int4_linear import GroupQuantized


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
    digest: str = ""  # the weight files' digest where the loading computed it (the weights cache's key); "": not


def load_weights(path: str | Path, keep_q4: bool = False) -> LoadedWeights:
    """``keep_q4``: also decode a GGUF file's Q4 tensors into ``quantized`` (a model that will use them)."""
    path = Path(path)
    if model_kind(path) == "gguf":
        from services.engine.weights.gguf_cache import cached
        from services.engine.weights.gguf_loader import load_gguf

        return cached(path, keep_q4, lambda keep: load_gguf(path, keep))
    from services.engine.weights.safetensors_loader import load_safetensors_dir

    return load_safetensors_dir(path)
