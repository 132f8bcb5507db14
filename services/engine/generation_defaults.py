"""A checkpoint's ``generation_config.json`` as default sampling settings, as vLLM's ``--generation-config
auto`` takes it: ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` apply to the
requests that leave them unset (Qwen3 ships temperature 0.6, top_p 0.95, top_k 20). GGUF files and
directories without the file have no defaults."""

from __future__ import annotations

import json
from pathlib import Path

from services.engine.errors import ModelLoadError

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_defaults(model_path: str | Path) -> dict[str, float | int]:
    """``{field: value}`` of the settings the checkpoint's ``generation_config.json`` gives (a
    ``do_sample: false`` config means greedy: temperature 0)."""
    path = Path(model_path)
    file = path / "generation_config.json"
    if not path.is_dir() or not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{file}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{file}: expected a JSON object")
    defaults: dict[str, float | int] = {}
    for name in FIELDS:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelLoadError(f"{file}: {name} must be a number, got {value!r}")
        defaults[name] = int(value) if name == "top_k" else float(value)
    if config.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return defaults
