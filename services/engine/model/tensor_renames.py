"""Renaming a checkpoint's tensors to the shared decoder's names: a family's ordered regex rules (as transformers'
conversion maps hold them), and the multi-token-prediction weights some checkpoints carry beside the model (``mtp.*``,
which transformers ignores on load: not read)."""

from __future__ import annotations

import re
from collections.abc import Iterable

Renames = tuple[tuple[re.Pattern[str], str], ...]


def renames(rules: Iterable[tuple[str, str]]) -> Renames:
    """``(pattern, replacement)`` rules compiled, applied in order by :func:`renamed`."""
    return tuple((re.compile(pattern), replacement) for pattern, replacement in rules)


def renamed(name: str, rules: Renames) -> str:
    """``name`` with every rule of ``rules`` applied, in order."""
    for pattern, replacement in rules:
        name = pattern.sub(replacement, name)
    return name


_MTP = re.compile(r"(^|\.)mtp\.")


def is_mtp_weight(name: str) -> bool:
    """A multi-token-prediction weight (``mtp.*`` anywhere in the name, as transformers' ``r"mtp.*"`` ignores it)."""
    return _MTP.search(name) is not None
