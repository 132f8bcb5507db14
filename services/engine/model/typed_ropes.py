"""Two ropes in one model: the main one and the local layers' (``ModelConfig.local_rope_layers``, rotating with a
plain rope of ``local_rope_theta``): MiMo-V2-Flash's and Mellum's sliding layers, Granite SWA's layers of its second
base, in the shared decoder's layer (:meth:`~services.engine.model.decoder.DecoderModel._rotate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.fused_ops import TorchRope
from services.engine.errors import ModelLoadError


@dataclass(frozen=True)
class TypedRopes:
    """The main rope (the model's, fused or torch's) and the local layers' (torch's, in the model dtype), both prepared
    once per step; each layer rotates with its own through :meth:`rotate`."""

    main: Any
    local: TorchRope

    def prepare(self, positions: torch.Tensor) -> tuple[Any, Any]:
        return self.main.prepare(positions), self.local.prepare(positions)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, step: tuple[Any, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer that rotates without naming its kind (a decoder whose attention is its own and does not call
        ``_rotate``) would take the main rope where its own differs: refused."""
        raise ModelLoadError("local rope layers rotate through DecoderModel._rotate only; this decoder's attention "
                             "calls the rope directly")

    def rotate(self, local: bool, q: torch.Tensor, k: torch.Tensor, step: tuple[Any, Any]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k of a local layer (``local``) or a full one, rotated with the step's prepared tables."""
        return self.local(q, k, step[1]) if local else self.main(q, k, step[0])
