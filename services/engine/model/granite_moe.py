"""IBM Granite 3.x MoE (granite-3.0/3.1-1b-a400m and -3b-a800m, base and instruct; ``granitemoe``) and its
variant with a shared expert (``granitemoeshared``): Granite's decoder and four scalars
(:mod:`services.engine.model.granite`) with a sparse mixture of experts on every layer.

- The router (``block_sparse_moe.router.layer``) takes each token's top-k logits and softmaxes them
  (:attr:`~services.engine.model.config.MoEConfig.softmax_after_topk`).
- The experts are stored stacked: ``input_linear`` is ``[experts, 2 * intermediate, hidden]``, the gate's rows
  first, then the up projection's. ``output_linear`` is ``[experts, hidden, intermediate]``. These are the
  shared decoder's fused expert tensors under other names (:func:`granite_moe_tensor_name`).
- ``granitemoeshared`` adds a shared SwiGLU MLP (``shared_mlp``, gate and up fused the same way) that every
  token goes through, with no gate of its own (Qwen2-MoE's has a sigmoid gate).

llama.cpp's ``granitemoe`` GGUF files hold both: its converter splits ``input_linear`` into ``ffn_gate_exps`` and
``ffn_up_exps`` (``output_linear`` is ``ffn_down_exps``; the shared MLP's are ``*_shexp``) and permutes q/k rows
as its llama converter does.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields
from services.engine.model.granite import config_from_gguf as granite_from_gguf
from services.engine.model.granite import config_from_hf as granite_from_hf
from services.engine.model.hf_config import required

ARCHITECTURE = "granite_moe"
GGUF_ARCHITECTURE = "granitemoe"

_RENAMES = (
    # the checkpoints' names, then transformers 5's in-memory ones (what a model saved by it may hold)
    (re.compile(r"\.block_sparse_moe\.input_linear\.weight$"), ".mlp.experts.gate_up_proj"),
    (re.compile(r"\.block_sparse_moe\.output_linear\.weight$"), ".mlp.experts.down_proj"),
    (re.compile(r"\.block_sparse_moe\.router\.layer\.weight$"), ".mlp.gate.weight"),
    (re.compile(r"\.block_sparse_moe\.experts\.(gate_up_proj|down_proj)$"), r".mlp.experts.\1"),
    (re.compile(r"\.block_sparse_moe\.router\.weight$"), ".mlp.gate.weight"),
    (re.compile(r"\.shared_mlp\.input_linear\.weight$"), ".mlp.shared_expert.gate_up_proj.weight"),
    (re.compile(r"\.shared_mlp\.output_linear\.weight$"), ".mlp.shared_expert.down_proj.weight"),
)


def granite_experts(num_experts: int, top_k: int, intermediate: int, num_layers: int, shared: int) -> MoEConfig:
    """Granite MoE's experts on every one of ``num_layers``: the softmax of each token's top-k logits, beside a
    shared MLP ``shared`` wide (0: none)."""
    return MoEConfig(num_experts=num_experts, top_k=top_k, intermediate_size=intermediate, norm_topk_prob=False,
                     softmax_after_topk=True, sparse_layers=tuple(range(num_layers)),
                     shared_expert_intermediate_size=shared or None, shared_expert_gated=False)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """``granitemoe`` and ``granitemoeshared`` (``shared_intermediate_size`` 0 or absent: no shared MLP)."""
    dense = granite_from_hf(cfg)
    moe = granite_experts(int(required(cfg, "num_local_experts")), int(required(cfg, "num_experts_per_tok")),
                   dense.intermediate_size, dense.num_layers, int(cfg.get("shared_intermediate_size") or 0))
    return _as_moe(dense, moe)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """As llama.cpp reads a ``granitemoe`` file: each expert ``feed_forward_length`` wide (unless
    ``expert_feed_forward_length`` says otherwise), a shared MLP where ``expert_shared_feed_forward_length`` is
    set, Granite's scalars as ``*_scale`` keys."""
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    dense = granite_from_gguf(fields, GGUF_ARCHITECTURE)
    width = f.get("expert_feed_forward_length") or f.key("feed_forward_length")
    moe = granite_experts(int(f.key("expert_count")), int(f.key("expert_used_count")), int(width), dense.num_layers,
                   int(f.get("expert_shared_feed_forward_length") or 0))
    return _as_moe(dense, moe)


def _as_moe(dense: ModelConfig, moe: MoEConfig) -> ModelConfig:
    return dataclasses.replace(dense, architecture=ARCHITECTURE, moe=moe)


def granite_moe_tensor_name(name: str) -> str:
    """A Granite MoE checkpoint tensor's name in the shared decoder (its fused expert tensors, its router)."""
    for pattern, replacement in _RENAMES:
        renamed, count = pattern.subn(replacement, name)
        if count:
            return renamed
    return name
