"""The gateway runs no model, so its process keeps torch out.

transformers imports torch whenever it is installed (its tokenizer classes import its configuration module,
whose rope helpers import torch): about 1 s of a gateway's start and 200 MB of its memory, for nothing it uses.
:func:`keep_torch_out` marks torch absent (``sys.modules["torch"] = None``) before anything imports
transformers, which then takes itself to be tokenizer-only. pdserve's own gateway code imports no torch either
(an import-linter contract). Two things transformers would read with torch are handled without it: a GGUF
file's tokenizer is converted once in a helper process (:mod:`services.engine.gguf_tokenizer`), and a tokenizer
the model directory brings as code may import torch, so ``--trust-remote-code`` leaves torch importable.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Sequence

from services.common.config import build_config
from services.gateway.config import GatewayConfig


def keep_torch_out(argv: Sequence[str]) -> bool:
    """Marks torch absent for this process unless it is imported already or the settings trust remote code
    (flags and ``PDSERVE_*`` variables, as the gateway reads them; settings it cannot read are its own to
    report, and leave torch importable). Returns whether it did."""
    if "torch" in sys.modules:
        return False
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            config = build_config(GatewayConfig, argv)
    except SystemExit:  # --help or a bad setting: the gateway's own parse answers it
        return False
    if config.trust_remote_code:
        return False
    sys.modules["torch"] = None  # type: ignore[assignment]  # import's own marker of a module that is absent
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # its "PyTorch was not found" notice
    return True
