"""Checked access to a checkpoint's tensors while a model is built from them.

Every tensor is taken by name with the shape the configuration implies; a missing tensor, a wrong shape,
a non-float dtype, or a tensor the model never took (a family feature pdserve would silently ignore) is a
:class:`ModelLoadError` that names it, raised before the node serves anything.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from services.engine.errors import ModelLoadError

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older checkpoints saved; recomputed from the config


class WeightSource:
    def __init__(self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
        self.tensors, self.dtype, self.device = tensors, dtype, device
        self.taken: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``name`` in the serving dtype (or ``dtype``) on the device, after checking its shape and
        dtype."""
        if name not in self.tensors:
            raise ModelLoadError(f"weights lack tensor {name!r}")
        tensor = self.tensors[name]
        if tuple(tensor.shape) != tuple(shape):
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, the config implies {tuple(shape)}")
        if tensor.dtype not in FLOAT_DTYPES:
            raise ModelLoadError(f"tensor {name!r} has dtype {tensor.dtype}; expected one of float32, bfloat16, "
                                 "float16 (quantized checkpoints other than GGUF are not supported)")
        self.taken.add(name)
        return tensor.to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def take_raw(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The packed tensor ``name`` as stored (on the CPU), after checking its shape and that it is ``dtype``
        (a quantized format's bytes, which a family's loader unpacks)."""
        if name not in self.tensors:
            raise ModelLoadError(f"weights lack tensor {name!r}")
        tensor = self.tensors[name]
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise ModelLoadError(f"tensor {name!r} is {tuple(tensor.shape)} {tensor.dtype}, the config implies "
                                 f"{tuple(shape)} {dtype}")
        self.taken.add(name)
        return tensor

    def skip(self, name: str) -> None:
        """Mark ``name`` (where the checkpoint has it) as read without converting it: a tensor the reference loader
        ignores too."""
        if name in self.tensors:
            self.taken.add(name)

    def check_all_taken(self) -> None:
        unused = sorted(n for n in self.tensors if n not in self.taken and not n.endswith(IGNORED_SUFFIXES))
        if unused:
            shown = ", ".join(unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
            raise ModelLoadError(f"weights hold tensors this architecture does not use: {shown} (another "
                                 "architecture, or a config that does not match the weights)")
