"""Read a Hugging Face Llama checkpoint directory (``config.json`` + ``*.safetensors``)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.weights.loader import LoadedWeights


def load_safetensors_dir(path: Path) -> LoadedWeights:
    config = ModelConfig.from_hf_config(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors files")
    tensors = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            tensors[name] = tensor.float()
    if "lm_head.weight" in tensors and config.tie_word_embeddings:
        del tensors["lm_head.weight"]
    return LoadedWeights(config=config, tensors=tensors, source=path)
