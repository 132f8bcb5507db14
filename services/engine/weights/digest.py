"""A digest of a model's weight files: the part of the KV fingerprint that tells two models apart.

Two models with the same name, shape and file size (a fine-tune, a re-quantisation, new weights at the
same path) compute different KV for the same tokens, so the fingerprint that prefix caches, decode
nodes and the cache-store compare must depend on the weights' bytes, not on a file's name or size.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from services.engine.weights.shards import shard_files

_CHUNK = 8 << 20


def weight_files(source: Path) -> list[Path]:
    """The files whose bytes make the model: a GGUF file, or a checkpoint directory's ``config.json`` and the
    shards the loader reads (``shards.shard_files``: not Mistral's own-format copy of the same weights)."""
    if source.is_file():
        return [source]
    return [source / "config.json", *shard_files(source)]


def weights_digest(source: Path) -> str:
    """Hex blake2b of the weight files' bytes (and, in a directory, their names), in order; reads them once
    (~1 GB/s). A GGUF file's name is not part of it: the same file under two names is the same model."""
    digest = hashlib.blake2b(digest_size=16)
    for path in weight_files(source):
        if source.is_dir():
            digest.update(path.name.encode() + b"\0")
        with path.open("rb") as file:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()
