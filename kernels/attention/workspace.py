"""Scratch buffers reused across layers and steps, so that large gathers do not allocate each call."""

from __future__ import annotations

import math

import torch


class Workspace:
    """Named scratch tensors that grow on demand and are reused; a view handed out by ``take`` is
    valid until the next ``take`` of the same name."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        key = (name, dtype, device)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            grown = numel if buffer is None else max(numel, buffer.numel() * 3 // 2)
            buffer = self._buffers[key] = torch.empty(grown, dtype=dtype, device=device)
        return buffer[:numel].view(shape)

    def clear(self) -> None:
        self._buffers.clear()
