"""A cache of dequantised GGUF weights: a process that loads a GGUF file it (or another process) already
loaded reads the dequantised tensors (float32; MXFP4 ones bfloat16), the 4-bit codes and the configuration from
one safetensors file instead of parsing the GGUF metadata and dequantising again (seconds per process for the
bundled 135M model).

Off unless ``PDSERVE_WEIGHTS_CACHE_DIR`` names a directory (the test suite sets one for its session: it
starts ~100 node processes of the same model). An entry is ``<weights digest of the file>-v<version>.safetensors``
— float32 weights take 4 bytes a parameter, eight times a Q4 file, so the cache is for small models and
development, not a default. Entries are written to a temporary file and renamed (processes starting at
once may each write one; the last rename wins, all equal). A corrupt or unreadable entry is ignored and
rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import structlog
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from kernels.int4_linear import GroupQuantized
from services.engine.weights.digest import weights_digest
from services.engine.weights.gguf_cache_config import cache_dir, config_from_dict, entry_path
from services.engine.weights.loader import LoadedWeights

log = structlog.get_logger(__name__)

_Q4 = ("q4.codes.", "q4.scales.", "q4.offsets.")


def cached(path: Path, keep_q4: bool, load: Callable[[bool], LoadedWeights]) -> LoadedWeights:
    """``load(keep_q4)``, through the cache when one is set (an entry keeps the 4-bit codes)."""
    directory = cache_dir()
    if directory is None:
        return load(keep_q4)
    digest = weights_digest(path)  # the entry's name, and the engine's identity: the file is read once
    entry = entry_path(directory, path, digest)
    found = _read(entry, path)
    if found is None:
        found = load(True)
        _write(entry, found)
    return dataclasses.replace(found, digest=digest, quantized=found.quantized if keep_q4 else {})


def _read(entry: Path, source: Path) -> LoadedWeights | None:
    if not entry.is_file():
        return None
    try:
        with safe_open(str(entry), "pt") as file:
            meta = json.loads(file.metadata()["pdserve"])
        stored = load_file(str(entry))
        config = config_from_dict(meta["config"])  # (an entry whose config no longer reads: rewritten too)
    except Exception as error:  # any damage: the entry is rewritten
        log.warning("weights cache: unreadable entry, loading the file", entry=str(entry), error=repr(error))
        return None
    tensors = {name: tensor for name, tensor in stored.items() if not name.startswith(_Q4)}
    quantized = {name: GroupQuantized(stored[_Q4[0] + name], stored[_Q4[1] + name], stored[_Q4[2] + name], size)
                 for name, size in meta["group_sizes"].items()}
    return LoadedWeights(config=config, tensors=tensors, source=source, quantized=quantized)


def _write(entry: Path, weights: LoadedWeights) -> None:
    tensors = {name: t.contiguous() for name, t in weights.tensors.items()}
    for name, q in weights.quantized.items():
        for prefix, part in zip(_Q4, (q.codes, q.scales, q.offsets), strict=True):
            tensors[prefix + name] = part.contiguous()
    meta = {"config": dataclasses.asdict(weights.config),
            "group_sizes": {name: q.group_size for name, q in weights.quantized.items()}}
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        os.close(fd)
        try:
            save_file(_unshared(tensors), temporary, metadata={"pdserve": json.dumps(meta)})
            os.replace(temporary, entry)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    except OSError as error:
        log.warning("weights cache: could not write an entry", entry=str(entry), error=repr(error))


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing memory (expert slices of one array): each gets its own copy."""
    seen: set[int] = set()
    out = {}
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out
