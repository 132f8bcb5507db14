"""Whether a model node serves the gateway's own model: the gateway tokenizes with its ``--model``'s
tokenizer and checks prompts against its config, so a node that loaded other weights (another model, a
fine-tune, a restart with another ``--model``) would get token ids that mean something else to it and
answer plausible-looking nonsense. Each model node reports its model's name and a digest of its weight
files (``NodeStatus.model_name`` / ``weights_digest``, ``services.engine.weights.digest``); the gateway
computes the digest of its own ``--model`` at startup. A node whose digest differs is unhealthy, saying
both models, and is never routed to. A node that reports no digest (an older node) matches any.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.gateway.nodes import DECODE, PREFILL, NodeInfo

if TYPE_CHECKING:
    from services.engine.model.config import ModelConfig

MISMATCH = "it serves another model"  # how the error of a node left out for its model starts


@dataclass(frozen=True)
class ModelIdentity:
    name: str
    weights_digest: str

    def describe(self) -> str:
        return f"{self.name or '?'} (weights {self.weights_digest[:12] or '?'})"


def model_identity(path: Path) -> tuple[ModelIdentity, ModelConfig]:
    """The identity a node that loads ``path`` reports, and the model's config (reads the weight files once,
    ~1 GB/s)."""
    from services.engine.weights.digest import weights_digest
    from services.engine.weights.model_config_reader import load_model_config

    digest = weights_digest(path)
    config = load_model_config(path, digest)
    return ModelIdentity(config.name, digest), config


def serves(node: NodeInfo, model: ModelIdentity) -> bool:
    return not node.weights_digest or not model.weights_digest or node.weights_digest == model.weights_digest


def with_model_check(nodes: Sequence[NodeInfo], model: ModelIdentity | None) -> list[NodeInfo]:
    """``nodes``, with each healthy prefill or decode node that serves another model than ``model``
    reported unhealthy (``None``: no check)."""
    if model is None:
        return list(nodes)
    return [node if node.role not in (PREFILL, DECODE) or not node.healthy or serves(node, model) else
            dataclasses.replace(node, healthy=False, error=(
                f"{MISMATCH}: {ModelIdentity(node.model_name, node.weights_digest).describe()}, the gateway "
                f"tokenizes for {model.describe()}; start both with the same --model"))
            for node in nodes]
