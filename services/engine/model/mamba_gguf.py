"""A llama.cpp file's Mamba-2 mixers (``granitehybrid``: IBM Granite 4.0's ``-H`` models; ``nemotron_h``; ``falcon-h1``,
whose norm is optional) and Mamba-1 layers (``jamba``) laid out as transformers holds them (the GGUF loader's hook,
``Family.gguf_tensors``), undoing what its converter did (the names are the loader's,
:mod:`services.engine.weights.gguf_names`):

- ``ssm_a`` holds ``-exp(A_log)`` as ``[heads, 1]``: ``A_log = log(-ssm_a)``, in float32, one per head;
- ``ssm_d`` is ``D`` as ``[heads, 1]``;
- ``ssm_norm`` is the gated norm's weight as ``[groups, intermediate / groups]``;
- the convolution weight was squeezed to ``[channels, taps]``: its channel dim comes back.

``in_proj`` (z, then x/B/C, then dt rows), ``out_proj``, the convolution's bias and ``dt_bias`` are stored as they are.
"""

from __future__ import annotations

import torch

from services.engine.model.config import Mamba2, ModelConfig


def mamba_from_gguf(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """``tensors`` (the GGUF loader's, under transformers' names) with each Mamba-2 mixer's (or Jamba's Mamba-1
    layer's: its ``ssm_a`` the whole ``[inner, state]`` matrix, its ``D`` stored flat) laid out as transformers holds
    them (see the module)."""
    spec = config.mamba or config.mamba1
    if spec is None:
        return tensors
    out = dict(tensors)
    for i in spec.layers:
        m = next(f"model.layers.{i}.{mixer}." for mixer in ("mamba", "mixer")
                 if f"model.layers.{i}.{mixer}.A_log" in out)
        a_log = torch.log(-out[m + "A_log"].float())
        out[m + "A_log"] = a_log.reshape(-1) if isinstance(spec, Mamba2) else a_log
        out[m + "D"] = out[m + "D"].reshape(-1)
        if m + "norm.weight" in out:  # Falcon-H1's mixers may have none
            out[m + "norm.weight"] = out[m + "norm.weight"].reshape(-1)
        out[m + "conv1d.weight"] = out[m + "conv1d.weight"].unsqueeze(1)
    return out
