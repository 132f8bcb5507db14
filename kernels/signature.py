"""What decides the deterministic mode's bits in this process, as one string (:func:`deterministic_kernels`).

A row's bits in the deterministic mode do not depend on its step, but they do depend on the kernels that
compute it: the native library's build (sources, compiler, flags and the CPU's feature flags, all in its
name: ``kernels.attention.native.build.library_path``), whether AMX serves the prompt rows, whether
:mod:`kernels.int4_fixed` serves the output rows' 4-bit products, and torch's
version (oneDNN's and the 4-bit kernels). Two processes give a row the same bits when their strings are
equal; the engine folds the string into its model fingerprint in the deterministic mode, so that nodes whose
kernels differ neither pair for a KV handoff nor share prefix-cache keys.
"""

from __future__ import annotations

import torch

from kernels.amx_linear import amx_supported
from kernels.attention.native.build import NativeBuildError, find_compiler, library_path
from kernels.int4_fixed import int4_fixed_supported


def deterministic_kernels(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type != "cpu":
        return f"{device.type}|torch {torch.__version__}"
    try:
        native = library_path(find_compiler()).name
    except NativeBuildError:
        native = "no native kernels"
    return f"{native}|amx {amx_supported()}|int4 fixed {int4_fixed_supported()}|torch {torch.__version__}"
