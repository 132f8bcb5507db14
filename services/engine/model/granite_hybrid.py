"""IBM Granite 4.0 (``granitemoehybrid``): the hybrid granite-4.0-h-micro, -h-tiny, -h-small, -h-1b, -h-350m, and
the attention-only granite-4.0-micro, -1b, -350m. Granite's decoder and four scalars
(:mod:`services.engine.model.granite`) with most layers Mamba-2 (a selective state space, a recurrent state per
request; :mod:`services.engine.model.mamba_decoder`) and a few attention layers (all of them in the models without
``-h``), rotated only where ``position_embedding_type`` is ``rope`` (``nope`` or null: no rope, as transformers).

The MLP is Granite MoE's (:mod:`services.engine.model.granite_moe`): experts on every layer (the softmax of the top-k
logits) beside an ungated shared MLP, or (``num_local_experts`` 0) the shared MLP alone as a dense one.

llama.cpp's ``granitehybrid`` GGUF files (:func:`config_from_gguf`): Granite's keys, the attention layers those whose
``attention.head_count_kv`` entry is not 0 (a per-layer array), the Mamba-2 mixers from ``ssm.*`` (laid out by
:mod:`services.engine.model.mamba_gguf`), q/k rows permuted as its llama converter does; ``rope.scaling.finetuned``
false (its converter's mark of a model without rope, whose ``context_length`` it then writes as 2**20) leaves every
attention layer unrotated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import Mamba2, ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, per_layer
from services.engine.model.granite import config_from_gguf as granite_from_gguf
from services.engine.model.granite import config_from_hf as granite_from_hf
from services.engine.model.hf_config import with_defaults

ARCHITECTURE = "granite_hybrid"
GGUF_ARCHITECTURE = "granitehybrid"
_MAMBA, _ATTENTION = ("mamba", "linear_attention"), ("attention", "full_attention")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import GraniteMoeHybridConfig

    full = with_defaults(ARCHITECTURE, GraniteMoeHybridConfig, cfg)
    if full.get("mamba_proj_bias"):
        raise ModelLoadError(f"{ARCHITECTURE}: mamba_proj_bias is not supported (no release has it)")
    limit = tuple(full.get("time_step_limit") or (0.0, float("inf")))
    if limit != (0.0, float("inf")):
        raise ModelLoadError(f"{ARCHITECTURE}: time_step_limit {list(limit)} is not supported (only none)")
    rope = full.get("position_embedding_type")  # transformers rotates only with "rope"; none (null) or "nope": not
    if rope not in ("rope", "nope", None):
        raise ModelLoadError(f"{ARCHITECTURE}: position_embedding_type {rope!r} is not supported (rope, nope, null)")
    kinds = list(full.get("layer_types") or [])
    if len(kinds) != int(full["num_hidden_layers"]) or any(k not in _MAMBA + _ATTENTION for k in kinds):
        raise ModelLoadError(f"{ARCHITECTURE}: layer_types must list {full['num_hidden_layers']} of mamba, attention; "
                             f"got {kinds}")
    dense = granite_from_hf({**full, "intermediate_size": full.get("shared_intermediate_size")})
    attention = tuple(i for i, kind in enumerate(kinds) if kind in _ATTENTION)
    mamba_layers = tuple(i for i, kind in enumerate(kinds) if kind in _MAMBA)
    if not attention:
        raise ModelLoadError(f"{ARCHITECTURE}: layer_types has no attention layer (a Mamba-only model is not served)")
    mamba = None if not mamba_layers else Mamba2(  # none: Granite 4.0's attention-only models (granite-4.0-micro)
        layers=mamba_layers, heads=int(full["mamba_n_heads"]), head_dim=int(full["mamba_d_head"]),
        state_size=int(full["mamba_d_state"]), groups=int(full["mamba_n_groups"]),
        conv_kernel=int(full["mamba_d_conv"]), conv_bias=bool(full.get("mamba_conv_bias", True)))
    if mamba is not None and mamba.intermediate != int(full["mamba_expand"]) * dense.hidden_size:
        raise ModelLoadError(f"{ARCHITECTURE}: mamba_n_heads × mamba_d_head must be mamba_expand × hidden_size")
    experts = int(full.get("num_local_experts") or 0)
    moe = None if not experts else MoEConfig(
        num_experts=experts, top_k=int(full["num_experts_per_tok"]), intermediate_size=int(full["intermediate_size"]),
        norm_topk_prob=False, softmax_after_topk=True, sparse_layers=tuple(range(dense.num_layers)),
        shared_expert_intermediate_size=dense.intermediate_size, shared_expert_gated=False)
    return dataclasses.replace(dense, architecture=ARCHITECTURE, mamba=mamba, moe=moe,
                               nope_layers=() if rope == "rope" else attention)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    kv_heads = per_layer(f, "attention.head_count_kv")
    layers = len(kv_heads)
    dense = granite_from_gguf(fields, GGUF_ARCHITECTURE)  # its one KV head count read from the array
    attention = tuple(i for i in range(layers) if kv_heads[i])
    if not attention:
        raise ModelLoadError(f"GGUF {GGUF_ARCHITECTURE}: no attention layer (a Mamba-only model is not served)")
    mamba = gguf_mamba(f, tuple(i for i in range(layers) if not kv_heads[i]))
    # the shared MLP's width (the dense MLP where there are no experts); each expert feed_forward_length wide
    experts, shared = int(f.get("expert_count") or 0), int(f.get("expert_shared_feed_forward_length") or 0)
    moe = None if not experts else MoEConfig(
        num_experts=experts, top_k=int(f.key("expert_used_count")),
        intermediate_size=int(f.get("expert_feed_forward_length") or dense.intermediate_size), norm_topk_prob=False,
        softmax_after_topk=True, sparse_layers=tuple(range(layers)), shared_expert_intermediate_size=shared or None,
        shared_expert_gated=False)
    rotated = f.get("rope.scaling.finetuned", True)
    return dataclasses.replace(dense, architecture=ARCHITECTURE, mamba=mamba, moe=moe,
                               intermediate_size=shared or dense.intermediate_size,
                               nope_layers=() if rotated else attention)


def gguf_mamba(f: GGUFFields, layers: tuple[int, ...]) -> Mamba2 | None:
    """The Mamba-2 mixers of ``layers`` from the file's ``ssm.*`` keys (heads ``time_step_rank``, their width
    ``inner_size`` / heads); the convolution's bias where the file holds one."""
    if not layers:
        return None
    heads = int(f.key("ssm.time_step_rank"))
    return Mamba2(layers=layers, heads=heads, head_dim=int(f.key("ssm.inner_size")) // heads,
                  state_size=int(f.key("ssm.state_size")), groups=int(f.key("ssm.group_count")),
                  conv_kernel=int(f.key("ssm.conv_kernel")),
                  conv_bias=f.has_tensor(".ssm_conv1d.bias"))
