"""``--nodes-file``: the node addresses from a JSON file a launcher writes once its nodes serve, so that the gateway
starts (imports, tokenizer, model identity: ~3 s) beside them instead of after them (``services.cluster.local``).

The file is ``{"prefill": "host:port,…", "decode": "…", "cache_store": "…"}`` (each as its flag takes it); the
gateway waits for it up to ``--nodes-file-timeout-s`` (a launcher writes it whole: a temporary file renamed), then
reads it as if the addresses had been given as flags. A file that is not such an object is refused naming it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

from services.gateway.config import GatewayConfig

POLL_S = 0.02
ROLES = ("prefill", "decode", "cache_store")


async def with_nodes_file(config: GatewayConfig) -> GatewayConfig:
    """``config`` with the addresses of its ``nodes_file`` (the file waited for); ``config`` itself without one."""
    path = config.nodes_file
    if path is None:
        return config
    deadline = time.monotonic() + config.nodes_file_timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes_file: no {path} after {config.nodes_file_timeout_s:g} s")
        await asyncio.sleep(POLL_S)
    return dataclasses.replace(config, nodes_file=None, **read_nodes_file(path))


def read_nodes_file(path: Path) -> dict[str, str]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"nodes_file: {path} is not readable JSON ({error})") from None
    if not isinstance(entries, dict) or set(entries) - set(ROLES) or \
            not all(isinstance(value, str) for value in entries.values()):
        raise ValueError(f"nodes_file: {path} must be an object of {', '.join(ROLES)} address strings, got {entries!r}")
    return {role: entries.get(role, "") for role in ROLES}


def write_nodes_file(path: Path, prefill: str, decode: str, cache_store: str = "") -> None:
    """Write the file whole (a temporary file renamed: the gateway never reads half of it)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"prefill": prefill, "decode": decode, "cache_store": cache_store}))
    temporary.replace(path)
