"""NVIDIA Nemotron-H (Nemotron-H 4B/8B/47B/56B, NVIDIA-Nemotron-Nano-9B/12B-v2, Nemotron 3 Nano/Super; ``nemotron_h``):
a stack of blocks, each one norm and one mixer (:mod:`services.engine.model.nemotron_h_decoder`): Mamba-2 (``M`` in
its ``hybrid_override_pattern``), attention without rope (``*``), a squared-ReLU MLP (``-``) or Nemotron 3's experts
(``E``): ``n_routed_experts`` squared-ReLU MLPs without a gate, each token's ``num_experts_per_tok`` chosen by the
sigmoid of float32 router logits plus ``e_score_correction_bias`` within the ``topk_group`` best of ``n_group``
groups, weighted by the sigmoid, renormalised (``norm_topk_prob``) and times ``routed_scaling_factor``, beside one
shared squared-ReLU MLP (``moe_shared_expert_intermediate_size`` wide, as transformers reads it) every token goes
through; Nemotron 3 Super's experts work in ``moe_latent_size`` (the tokens projected down before them, their sum
back up after; the router and the shared expert see the hidden width). Its multi-token-prediction layers are not
read (speculative decoding, which pdserve does not run).

The step sizes are floored at ``time_step_limit``'s lower bound (0 in the releases), as vLLM, TensorRT-LLM and
NVIDIA's own CUDA path do; transformers' torch fallback floors its full-sequence path (not its decode step) at
``time_step_min`` (0.001) instead, which a step size of a trained model rarely comes near.

llama.cpp's ``nemotron_h`` and ``nemotron_h_moe`` (Nemotron 3) GGUF files (:func:`config_from_gguf`): a block's kind
from its entries of the per-layer ``attention.head_count_kv`` and ``feed_forward_length`` arrays (both 0: Mamba-2; a
width: the MLP, or in a ``nemotron_h_moe`` file the experts; else attention), the Mamba-2 mixers from ``ssm.*`` (laid
out by :mod:`services.engine.model.mamba_gguf`), no rope anywhere, no step floor (llama.cpp clamps none: the releases'
floor is 0). The experts from ``expert_*`` (as llama.cpp runs them: sigmoid routing whatever ``expert_gating_func``
says, groups only where ``expert_group_count`` > 1), the latent width from ``moe_latent_size``; the
multi-token-prediction blocks (the last ``nextn_predict_layers``) not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import Mamba2, ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids, per_layer
from services.engine.model.granite_hybrid import gguf_mamba
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = GGUF_ARCHITECTURE = "nemotron_h"
MOE_GGUF_ARCHITECTURE = "nemotron_h_moe"
# what every Nemotron 3 expert block is, whichever file it is read from: squared-ReLU experts and shared MLP without a
# gate, sigmoid routing (with the correction bias), the weighted outputs summed in float32
_NEMOTRON_3_EXPERTS = dict(gated_experts=False, shared_expert_gated=False, sigmoid_routing=True,
                           float32_expert_sum=True)
_KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention", "attention": "attention",
          "mlp": "mlp"}


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import NemotronHConfig

    full = with_defaults(ARCHITECTURE, NemotronHConfig, cfg)
    kinds = [_KINDS.get(kind, kind) for kind in full.get("layer_types") or full.get("layers_block_type") or []]
    unknown = sorted(set(kinds) - {"mamba", "attention", "mlp", "moe"})
    if unknown:
        raise ModelLoadError(f"{ARCHITECTURE}: block types {unknown} are not supported (mamba, attention, mlp, moe)")
    if "attention" not in kinds:  # (no release; Mamba-2 blocks alone are model_type mamba2's)
        raise ModelLoadError(f"{ARCHITECTURE}: no attention block among {kinds} is not supported")
    for key in ("mamba_proj_bias", "use_bias", "mlp_bias", "attention_bias", "residual_in_fp32"):
        if full.get(key):
            raise ModelLoadError(f"{ARCHITECTURE}: {key} is not supported (no release has it)")
    if full.get("mlp_hidden_act", "relu2") != "relu2" or full.get("mamba_hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{ARCHITECTURE}: activations {full.get('mlp_hidden_act')!r}/"
                             f"{full.get('mamba_hidden_act')!r} are not supported (relu2, silu)")
    if full.get("sliding_window"):
        raise ModelLoadError(f"{ARCHITECTURE}: sliding_window is not supported")
    if full.get("block_configs"):  # NVIDIA's per-layer widths and experts (its heterogeneous checkpoints)
        raise ModelLoadError(f"{ARCHITECTURE}: block_configs is not supported (one width and one set of experts)")
    if full.get("tie_word_embeddings"):  # transformers never ties this family's head
        raise ModelLoadError(f"{ARCHITECTURE}: tie_word_embeddings is not supported (its head is its own)")
    limit = tuple(full.get("time_step_limit") or (0.0, float("inf")))
    if len(limit) != 2 or limit[1] != float("inf"):
        raise ModelLoadError(f"{ARCHITECTURE}: time_step_limit {list(limit)} is not supported (only an upper bound of "
                             "infinity)")
    fields = base_fields({**full, "num_hidden_layers": len(kinds), "rms_norm_eps": full["layer_norm_epsilon"]},
                         ARCHITECTURE, check_mlp=False)
    of = {kind: tuple(i for i in range(len(kinds)) if kinds[i] == kind) for kind in ("mamba", "attention", "moe")}
    mamba = None if not of["mamba"] else Mamba2(
        layers=of["mamba"], heads=int(full["mamba_num_heads"]), head_dim=int(full["mamba_head_dim"]),
        state_size=int(full["ssm_state_size"]), groups=int(full["n_groups"]), conv_kernel=int(full["conv_kernel"]),
        conv_bias=bool(full.get("use_conv_bias", True)), dt_min=float(limit[0]))
    moe = _experts(full, of["moe"])
    if moe is not None and "mlp" not in kinds:  # no block reads the dense width: the experts', as a GGUF file says
        fields["intermediate_size"] = moe.intermediate_size
    return ModelConfig(**fields, mamba=mamba, moe=moe, block_kinds=tuple(kinds), nope_layers=of["attention"])


def _experts(full: Mapping[str, Any], layers: tuple[int, ...]) -> MoEConfig | None:
    """Nemotron 3's experts on ``layers`` (None where the pattern has no ``E``)."""
    if not layers:
        return None
    # transformers reads one shared MLP whatever it says, vLLM multiplies its width by it: 1 is what both serve alike
    if full.get("n_shared_experts") not in (None, 1):
        raise ModelLoadError(f"{ARCHITECTURE}: n_shared_experts {full.get('n_shared_experts')} is not supported (1: "
                             "one shared MLP, as every release has)")
    latent = full.get("moe_latent_size")
    return MoEConfig(
        num_experts=int(full["n_routed_experts"]), top_k=int(full["num_experts_per_tok"]),
        intermediate_size=int(full["moe_intermediate_size"]), norm_topk_prob=bool(full.get("norm_topk_prob", True)),
        sparse_layers=layers, shared_expert_intermediate_size=int(full["moe_shared_expert_intermediate_size"]),
        expert_groups=int(full.get("n_group") or 1), top_groups=int(full.get("topk_group") or 1),
        routed_scaling=float(full.get("routed_scaling_factor") or 1.0),
        latent_size=None if latent is None else int(latent), **_NEMOTRON_3_EXPERTS)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    arch = str(fields.get("general.architecture"))
    f = GGUFFields(fields, arch)
    layers = int(f.key("block_count")) - int(f.get("nextn_predict_layers") or 0)
    kv_heads, widths = per_layer(f, "attention.head_count_kv")[:layers], per_layer(f, "feed_forward_length")[:layers]
    if len(set(widths) - {0}) > 1:
        raise ModelLoadError(f"GGUF {arch}: feed_forward_length must list {layers} layers of 0 or one width, got "
                             f"{widths}")
    feed_forward = "moe" if arch == MOE_GGUF_ARCHITECTURE else "mlp"
    kinds = tuple(feed_forward if widths[i] else "attention" if kv_heads[i] else "mamba" for i in range(layers))
    base = gguf_base_fields({**fields, f"{arch}.feed_forward_length": max(widths)}, arch)
    of = {kind: tuple(i for i in range(layers) if kinds[i] == kind) for kind in ("mamba", "attention", "moe")}
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "num_layers": layers,
                          "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       mamba=gguf_mamba(f, of["mamba"]), moe=_gguf_experts(f, of["moe"]), block_kinds=kinds,
                       nope_layers=of["attention"])


def _gguf_experts(f: GGUFFields, layers: tuple[int, ...]) -> MoEConfig | None:
    """A ``nemotron_h_moe`` file's experts on ``layers``, as :func:`_experts` reads the checkpoint's."""
    if not layers:
        return None
    groups = int(f.get("expert_group_count") or 1)
    if groups > 1 and not f.get("expert_group_used_count"):  # llama.cpp's loader asserts it
        raise ModelLoadError(f"GGUF {f.arch}: expert_group_count {groups} without expert_group_used_count")
    if f.get("expert_shared_count") not in (None, 1):
        raise ModelLoadError(f"GGUF {f.arch}: expert_shared_count {f.get('expert_shared_count')} is not supported (1: "
                             "one shared MLP, as every release has)")
    latent = f.get("moe_latent_size")
    return MoEConfig(
        num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
        intermediate_size=int(f.key("expert_feed_forward_length")), norm_topk_prob=bool(f.get("expert_weights_norm")),
        sparse_layers=layers, shared_expert_intermediate_size=int(f.key("expert_shared_feed_forward_length")),
        expert_groups=groups, top_groups=int(f.get("expert_group_used_count") or 1),
        routed_scaling=float(f.get("expert_weights_scale") or 1.0), latent_size=int(latent) if latent else None,
        **_NEMOTRON_3_EXPERTS)


def nemotron_h_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the model (``backbone.`` or transformers' ``model.`` prefix; the embedding and
    final norm under the shared decoder's names; each block's norm as its input norm; an MoE block's
    ``shared_experts`` as the shared decoder's ``shared_expert``); None for the multi-token-prediction layers' (not
    read)."""
    if name.startswith("mtp."):
        return None
    if name.startswith("backbone."):
        name = "model." + name.removeprefix("backbone.")
    renamed = {"model.embeddings.weight": "model.embed_tokens.weight", "model.norm_f.weight": "model.norm.weight"}
    if name in renamed:
        return renamed[name]
    if name.startswith("model.layers.") and name.endswith(".norm.weight") and ".mixer." not in name:
        return name.removesuffix("norm.weight") + "input_layernorm.weight"
    return name.replace(".mixer.shared_experts.", ".mixer.shared_expert.")
