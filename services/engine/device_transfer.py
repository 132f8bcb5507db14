"""The small host↔device moves of a sampling step, made so the host does not wait for the GPU's queue.

A CUDA tensor built from a Python list or a pageable array (``logits[[1, 2]]``, ``torch.tensor(x,
device=...)``) is copied synchronously: the host stalls until the forward the step queued has run. Host
values here go through pinned memory and an asynchronous copy instead, and the results come back together,
after one wait (:func:`to_host`). On a CPU both are no-ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(values: Sequence[int] | Sequence[float] | np.ndarray, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """``values`` as a ``dtype`` tensor on ``device``, copied without a stream sync where that is a GPU."""
    tensor = torch.from_numpy(np.ascontiguousarray(values)).to(dtype) if isinstance(values, np.ndarray) else \
        torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor on the host, after a single wait for the device (a GPU step's one sync)."""
    on_device = [t for t in tensors if t.device.type != "cpu"]
    if not on_device:
        return list(tensors)
    host = [t.to("cpu", non_blocking=True) if t.device.type != "cpu" else t for t in tensors]
    if on_device[0].device.type == "cuda":
        torch.cuda.current_stream(on_device[0].device).synchronize()
    return host
