"""Which files of a Hugging Face checkpoint directory hold its weights: the shards ``model.safetensors.index.json``
lists when there is an index, else every ``*.safetensors`` but Mistral's own-format ``consolidated*.safetensors``
(Mistral's repositories ship those beside the Hugging Face shards: the same weights again, under other names). The
loader reads these and the weights digest hashes these (torch-free: the gateway computes the digest too).
"""

from __future__ import annotations

import json
from pathlib import Path

from services.engine.errors import ModelLoadError

INDEX = "model.safetensors.index.json"
MISTRAL_FORMAT = "consolidated"


def shard_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files (see the module); a shard the index lists but the directory lacks, or a
    directory without one, is refused by name."""
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index}: not a safetensors index ({exc})") from exc
        names = sorted(set(weight_map.values()))
        missing = [name for name in names if not (path / name).is_file()]
        if missing:
            raise ModelLoadError(f"{path}: shard(s) {', '.join(missing)} listed in {INDEX} are missing")
        return [path / name for name in names]
    files = sorted(f for f in path.glob("*.safetensors") if not f.name.startswith(MISTRAL_FORMAT))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors files")
    return files
