"""DeepSeek-V2 and V2-Lite (``deepseek_v2``), DeepSeek-V3, V3.1 and R1 and the checkpoints of their architecture
(``deepseek_v3``; Kimi K2's ``kimi_k2`` and Moonlight's configs are DeepSeek-V3's; Kimi K2.5's and K2.6's
``kimi_k25`` is a vision-language checkpoint around one, whose text model is served, its vision tower and projector
not read; Sarvam-105B's ``sarvam_mla`` is one too, :mod:`services.engine.model.sarvam`): multi-head latent attention
(:class:`~services.engine.model.config.LatentAttention`, served by :mod:`services.engine.model.mla_decoder`) and
experts from the ``first_k_dense_replace``-th layer on, beside ``n_shared_experts`` ungated shared experts.

- Attention: q through ``q_a_proj``, ``q_a_layernorm`` and ``q_b_proj`` (V2-Lite: one ``q_proj``); the latent KV
  through ``kv_a_proj_with_mqa`` and ``kv_a_layernorm``; rope on pairs of adjacent dims of the rope part
  (``rope_interleave``, V2's complex rotation); scores scaled by ``qk_head_dim ** -0.5``, times ``mscale ** 2`` of
  ``mscale_all_dim`` under yarn, as transformers scales them.
- V3's routing: the sigmoid of float32 router logits, chosen with ``e_score_correction_bias`` among the
  ``topk_group`` best of ``n_group`` groups (``noaux_tc``); V2's: the float32 softmax, greedy or
  ``group_limited_greedy`` (:attr:`~services.engine.model.config.MoEConfig.group_limited_softmax`). Both times
  ``routed_scaling_factor``.
- V3's multi-token-prediction layers after the last (``model.layers.61.*``) are not read.

llama.cpp's ``deepseek2`` GGUF files too (:mod:`services.engine.model.deepseek_gguf`).

Refused by name: ``attention_bias`` (no released checkpoint has it), a ``moe_layer_freq`` other than 1, and other
scoring functions or top-k methods. The official V3/R1/Kimi K2 files are FP8 with block scales, which the weight
loader dequantises to bf16 (:mod:`services.engine.weights.fp8_blocks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels.rope_scaling import yarn_mscale
from services.engine.errors import ModelLoadError
from services.engine.model.config import LatentAttention, ModelConfig, MoEConfig, Multipliers, SparseIndex
from services.engine.model.glm4_moe import glm4_moe_tensor_name
from services.engine.model.hf_config import base_fields, required
from services.engine.model.multimodal_text import text_config, text_tensor_name
from services.engine.model.sarvam import SARVAM_MLA, sarvam_mla_as_deepseek_v3

ARCHITECTURE = "deepseek"
KIMI_K25 = "kimi_k25"
KIMI_K25_TEXT_TYPES = ("deepseek_v3", "kimi_k2")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    if cfg.get("model_type") == KIMI_K25:
        cfg = _kimi_k25_text(cfg)
    elif cfg.get("model_type") == SARVAM_MLA:
        cfg = sarvam_mla_as_deepseek_v3(cfg)
    v2 = cfg.get("model_type") == "deepseek_v2"
    if v2:
        cfg = {"first_k_dense_replace": 0, "topk_method": "greedy", "norm_topk_prob": False, "q_lora_rank": 1536,
               "n_routed_experts": 64, "n_shared_experts": 2, **present(cfg)}  # DeepseekV2Config's
        routing = _v2_routing(cfg)
    else:
        cfg = {"first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
               "norm_topk_prob": True, "q_lora_rank": 1536, "n_routed_experts": 256, "n_shared_experts": 1,
               **present(cfg)}  # DeepseekV3Config's
        routing = _v3_routing(cfg)
    layers = int(required(cfg, "num_hidden_layers"))
    first_sparse = int(cfg["first_k_dense_replace"])
    if int(cfg.get("moe_layer_freq", 1)) != 1:
        raise ModelLoadError(f"{cfg.get('model_type')}: moe_layer_freq {cfg['moe_layer_freq']} is not supported "
                             "(only 1: experts on every layer from first_k_dense_replace)")
    moe = sparse_mlp(cfg, tuple(range(first_sparse, layers)), **routing)
    return latent_config(cfg, ARCHITECTURE, moe, interleaved=True if v2 else bool(cfg.get("rope_interleave", True)))


def _kimi_k25_text(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A ``kimi_k25`` checkpoint's text model config (DeepSeek-V3's, tied as :func:`multimodal_text.text_config`
    reads a wrapper; the class's default ties, the releases write false); another text model type is refused."""
    text = text_config(cfg, KIMI_K25, default_tie=True)
    model_type = text.get("model_type", "deepseek_v3")
    if model_type not in KIMI_K25_TEXT_TYPES:
        raise ModelLoadError(f"kimi_k25: a text model of type {model_type!r} is not supported (only "
                             f"{', '.join(KIMI_K25_TEXT_TYPES)})")
    return {**text, "model_type": model_type}


def deepseek_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the latent decoder: a wrapper's text model's (Kimi K2.5's
    ``language_model.model.*``, Mistral Small 4's), its shared experts the decoder's shared expert; None for the
    vision tower's and the projector's (not read)."""
    text = text_tensor_name(name)
    return None if text is None else glm4_moe_tensor_name(text)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``deepseek2`` file's config (:mod:`services.engine.model.deepseek_gguf`)."""
    from services.engine.model.deepseek_gguf import config_from_gguf as read

    return read(fields)


def latent_config(cfg: Mapping[str, Any], architecture: str, moe: MoEConfig | None, interleaved: bool,
                  index: SparseIndex | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of a DeepSeek-style checkpoint with latent attention (``interleaved``: its rope
    rotates pairs of adjacent dims; ``index``: DeepSeek-V3.2's sparse attention indexer)."""
    if cfg.get("attention_bias"):
        raise ModelLoadError(f"{cfg.get('model_type')}: attention_bias is not supported with latent attention")
    q_lora = cfg.get("q_lora_rank")
    mla = LatentAttention(kv_lora_rank=int(required(cfg, "kv_lora_rank")),
                          qk_rope_head_dim=int(required(cfg, "qk_rope_head_dim")),
                          qk_nope_head_dim=int(required(cfg, "qk_nope_head_dim")),
                          v_head_dim=int(required(cfg, "v_head_dim")),
                          q_lora_rank=None if q_lora is None else int(q_lora), index=index)
    fields = base_fields(_without_partial_rotary(cfg, mla), architecture)
    scaling = fields["rope_scaling"]
    scale = mla.qk_head_dim**-0.5
    if scaling is not None and scaling.mscale_all_dim:  # transformers' yarn_apply_mscale
        scale *= yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    return ModelConfig(**{**fields, "num_kv_heads": 1, "head_dim": mla.cache_dim, "rotary_dim": mla.qk_rope_head_dim},
                       mla=mla, moe=moe, rope_interleaved=interleaved, multipliers=Multipliers(attention=scale))


def _without_partial_rotary(cfg: Mapping[str, Any], mla: LatentAttention) -> dict[str, Any]:
    """``cfg`` without ``head_dim`` and ``partial_rotary_factor`` (the latent attention's own dims say them); a
    rope parameters' factor (Mistral 4 writes ``qk_rope_head_dim / qk_head_dim``) must be that one."""
    out = {k: v for k, v in cfg.items() if k not in ("head_dim", "partial_rotary_factor")}
    for key in ("rope_parameters", "rope_scaling"):
        params = out.get(key)
        if isinstance(params, Mapping) and "partial_rotary_factor" in params:
            factor = float(params["partial_rotary_factor"])
            if int(mla.qk_head_dim * factor) != mla.qk_rope_head_dim:
                raise ModelLoadError(f"{cfg.get('model_type')}: {key}.partial_rotary_factor {factor} does not give "
                                     f"qk_rope_head_dim {mla.qk_rope_head_dim} of the {mla.qk_head_dim}-wide heads")
            out[key] = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
    return out


def sparse_mlp(cfg: Mapping[str, Any], sparse_layers: tuple[int, ...], **routing: Any) -> MoEConfig | None:
    """The experts of a DeepSeek-style config on ``sparse_layers`` (None: a checkpoint without routed experts)."""
    experts = cfg.get("n_routed_experts")
    if not experts or not sparse_layers:
        return None
    width = int(required(cfg, "moe_intermediate_size"))
    return MoEConfig(
        num_experts=int(experts), top_k=int(required(cfg, "num_experts_per_tok")), intermediate_size=width,
        norm_topk_prob=bool(cfg.get("norm_topk_prob")), sparse_layers=sparse_layers,
        shared_expert_intermediate_size=width * int(cfg.get("n_shared_experts") or 0) or None,
        shared_expert_gated=False, routed_scaling=float(cfg.get("routed_scaling_factor") or 1.0), **routing)


def _v3_routing(cfg: Mapping[str, Any]) -> dict[str, Any]:
    for key, supported in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if cfg.get(key, supported) != supported:
            raise ModelLoadError(f"{cfg.get('model_type')}: {key} {cfg[key]!r} is not supported (only {supported!r})")
    return dict(sigmoid_routing=True, expert_groups=int(cfg.get("n_group") or 1),
                top_groups=int(cfg.get("topk_group") or 1))


def _v2_routing(cfg: Mapping[str, Any]) -> dict[str, Any]:
    method = cfg["topk_method"]
    if cfg.get("scoring_func", "softmax") != "softmax" or method not in ("greedy", "group_limited_greedy"):
        raise ModelLoadError(f"deepseek_v2: scoring_func {cfg.get('scoring_func')!r} with topk_method {method!r} is "
                             "not supported (only softmax, with greedy or group_limited_greedy)")
    if cfg.get("norm_topk_prob"):  # transformers' V2 ignores it; DeepSeek's own code renormalises (and not scales)
        raise ModelLoadError("deepseek_v2: norm_topk_prob true is not supported (transformers and DeepSeek's code "
                             "read it differently; every release sets it false)")
    if method == "greedy":
        return dict(group_limited_softmax=True)
    return dict(group_limited_softmax=True, expert_groups=int(required(cfg, "n_group")),
                top_groups=int(required(cfg, "topk_group")))


def present(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg``'s set keys (a null one takes the config class's default), ``q_lora_rank`` kept even null (none)."""
    return {k: v for k, v in cfg.items() if v is not None or k == "q_lora_rank"}
