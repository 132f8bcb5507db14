"""Reading a Hugging Face ``config.json`` into :class:`ModelConfig`: the fields every family shares, rope
scaling in both spellings (``rope_theta`` + ``rope_scaling``, or transformers 5's ``rope_parameters``), and
refusals that name the field for anything pdserve would otherwise serve wrong."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kernels.rope_scaling import RopeScaling, UnsupportedRopeError
from services.engine.errors import ModelLoadError

log = logging.getLogger(__name__)


def required(cfg: Mapping[str, Any], name: str) -> Any:
    value = cfg.get(name)
    if value is None:
        raise ModelLoadError(f"config.json lacks {name!r} (model_type {cfg.get('model_type')!r})")
    return value


def rope_settings(cfg: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """``(theta, scaling)`` from either spelling; an unknown rope type is refused by name."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type == "default":
        return theta, None
    # transformers' precedence (standardize_rope_params): the top level's, then the scaling's own, then the context
    original = (cfg.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
                or cfg.get("max_position_embeddings"))
    defaults = RopeScaling()

    def number(key: str, default: float | None) -> float | None:
        return default if params.get(key) is None else float(params[key])

    factor = params.get("factor")
    if factor is None and rope_type in ("yarn", "longrope") and original:  # transformers: the context's growth
        factor = int(required(cfg, "max_position_embeddings")) / int(original)
    try:
        return theta, RopeScaling(
            rope_type=rope_type, factor=float(factor or 1.0),
            original_max_position=None if original is None else int(original),
            low_freq_factor=number("low_freq_factor", defaults.low_freq_factor),
            high_freq_factor=number("high_freq_factor", defaults.high_freq_factor),
            beta_fast=number("beta_fast", defaults.beta_fast) or defaults.beta_fast,
            beta_slow=number("beta_slow", defaults.beta_slow) or defaults.beta_slow,
            attention_factor=number("attention_factor", None), mscale=number("mscale", None),
            mscale_all_dim=number("mscale_all_dim", None), truncate=bool(params.get("truncate", True)),
            short_factor=None if params.get("short_factor") is None
            else tuple(float(f) for f in params["short_factor"]),
            rotated_fraction=1.0 if rope_type != "proportional" or params.get("partial_rotary_factor") is None
            else float(params["partial_rotary_factor"]),
        )
    except UnsupportedRopeError as exc:
        raise ModelLoadError(f"{cfg.get('model_type')}: {exc}") from exc


def eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)


def served_length(cfg: Mapping[str, Any], scaling: RopeScaling | None) -> int:
    """The longest sequence served exactly: ``max_position_embeddings``. Dynamic NTK rope equals plain rope up to
    it (transformers rescales only past it), so it needs no cap; a sliding window is served exactly
    (``ModelConfig.layer_windows``). Longrope is capped at ``original_max_position_embeddings`` (logged):
    transformers rotates a longer sequence's every position with other factors, which a KV cache cannot."""
    length = int(required(cfg, "max_position_embeddings"))
    if scaling is not None and scaling.rope_type == "longrope" and scaling.original_max_position < length:
        log.warning("longrope: serving at most %d tokens (max_position_embeddings %d): past them transformers "
                    "switches every position to its long factors", scaling.original_max_position, length)
        length = scaling.original_max_position
    return length


def rotary_dim(cfg: Mapping[str, Any], head_dim: int) -> int | None:
    """The rotated dims of a head (``partial_rotary_factor`` of it, as transformers rounds it); None: all (and a
    proportional rope's, whose factor picks frequencies across the whole head: ``RopeScaling.rotated_fraction``)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if (params.get("rope_type") or params.get("type")) == "proportional":
        return None
    factor = float(params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0)
    if factor == 1.0:
        return None
    dim = int(head_dim * factor)
    if dim % 2 or not 0 < dim <= head_dim:
        raise ModelLoadError(f"partial_rotary_factor {factor} of head_dim {head_dim} gives {dim} rotary dims "
                             "(must be even, and at most head_dim)")
    return dim


def base_fields(cfg: Mapping[str, Any], architecture: str, check_mlp: bool = True,
                partial_rotary: bool = False) -> dict[str, Any]:
    """The fields of :class:`ModelConfig` a Llama-shaped ``config.json`` gives, for a family to extend
    (``check_mlp``: refuse an activation other than SiLU, and MLP biases; a family with its own MLP checks it;
    ``partial_rotary``: the family's rope reads ``partial_rotary_factor``, which the others' refuse by name, as
    transformers' rotate the whole head whatever it says)."""
    if check_mlp and cfg.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (only 'silu')")
    if check_mlp and cfg.get("mlp_bias"):
        raise ModelLoadError("mlp_bias is not supported")
    heads = int(required(cfg, "num_attention_heads"))
    hidden = int(required(cfg, "hidden_size"))
    theta, scaling = rope_settings(cfg)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rotary = rotary_dim(cfg, head_dim)
    if rotary is not None and not partial_rotary:
        raise ModelLoadError(f"partial_rotary_factor is not supported for {architecture} (its rope rotates the whole "
                             "head, as transformers' does)")
    if scaling is not None and scaling.short_factor is not None \
            and len(scaling.short_factor) != (rotary or head_dim) // 2:
        raise ModelLoadError(f"longrope has {len(scaling.short_factor)} short factors, the rotary dim "
                             f"{rotary or head_dim} needs {(rotary or head_dim) // 2}")
    return dict(
        architecture=architecture,
        name=str(cfg.get("_name_or_path") or architecture),
        vocab_size=int(required(cfg, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(required(cfg, "intermediate_size")),
        num_layers=int(required(cfg, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rotary_dim=rotary,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position=served_length(cfg, scaling),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=None if cfg.get("bos_token_id") is None else int(cfg["bos_token_id"]),
        eos_token_ids=eos_ids(cfg.get("eos_token_id")),
    )


def typed_ropes(cfg: Mapping[str, Any], architecture: str, **base_options: Any) -> tuple[dict[str, Any], float | None]:
    """``(base_fields, the sliding layers' rope base)`` of a config whose ``rope_parameters`` hold a rope per layer kind
    (MiMo-V2-Flash's, Mellum's): the full layers' is the main rope; the sliding layers' must be plain over the same
    rotated dims (``ModelConfig.local_rope_theta``), else refused by name; None where the config names none."""
    ropes = cfg["rope_parameters"]
    fields = base_fields({**cfg, "rope_parameters": ropes["full_attention"]}, architecture, **base_options)
    sliding = ropes.get("sliding_attention")
    if sliding is None:
        return fields, None
    local_theta, local_scaling = rope_settings({"rope_parameters": sliding})
    if local_scaling is not None or rotary_dim(sliding, fields["head_dim"]) != fields["rotary_dim"]:
        raise ModelLoadError(f"{architecture}: the sliding layers' rope must be plain over the full layers' rotary "
                             f"dims, got {sliding}")
    return fields, local_theta


def silu_mlp(cfg: Mapping[str, Any], architecture: str) -> bool:
    """Whether the SwiGLU MLP of a config whose MLP may have biases has them (``mlp_bias``; the shared decoder reads
    them); another ``hidden_act`` is refused by name."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{architecture}: hidden_act {cfg.get('hidden_act')!r} is not supported (only 'silu')")
    return bool(cfg.get("mlp_bias"))


def every_layer_window(cfg: Mapping[str, Any], max_position: int, default: int | None = None
                       ) -> tuple[int | None, ...]:
    """``ModelConfig.layer_windows`` of a checkpoint whose ``sliding_window`` holds on every layer (Mistral,
    Phi-3): empty where there is none, or where it is no shorter than the context (it then hides nothing).
    ``default``: transformers' value where the key is absent (Mistral's 4096; null, as every release writes
    it, is none)."""
    window = cfg.get("sliding_window", default)
    if window is None or int(window) >= max_position:
        return ()
    return (int(window),) * int(required(cfg, "num_hidden_layers"))


LAYER_TYPES = ("sliding_attention", "full_attention")


def typed_layer_windows(architecture: str, layer_types: list[str], num_layers: int, window: int | None
                        ) -> tuple[int | None, ...]:
    """``ModelConfig.layer_windows`` of a config's ``layer_types`` (Gemma 2 and 3, GPT-OSS): ``window`` on each
    ``sliding_attention`` layer, None on each ``full_attention`` one; a list of another length or kind, or sliding
    layers without a window, is refused naming it."""
    if len(layer_types) != num_layers or set(layer_types) - set(LAYER_TYPES):
        raise ModelLoadError(f"{architecture}: layer_types must list {num_layers} of {', '.join(LAYER_TYPES)}, "
                             f"got {layer_types}")
    if window is None and "sliding_attention" in layer_types:
        raise ModelLoadError(f"{architecture}: layer_types has sliding_attention layers but sliding_window is null")
    return tuple(int(window) if kind == "sliding_attention" else None for kind in layer_types)


def qwen_layer_windows(cfg: Mapping[str, Any], max_position: int) -> tuple[int | None, ...]:
    """Qwen2/Qwen3's windows, as transformers sets them: only with ``use_sliding_window``, on the layers that
    ``layer_types`` names ``sliding_attention`` (by default those from ``max_window_layers`` on; an absent
    ``sliding_window`` is transformers' 4096)."""
    window = cfg.get("sliding_window", 4096)
    if not cfg.get("use_sliding_window") or window is None or int(window) >= max_position:
        return ()
    layers = int(required(cfg, "num_hidden_layers"))
    first = int(cfg.get("max_window_layers", 28))
    kinds = cfg.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    windows = tuple(int(window) if kind == "sliding_attention" else None for kind in kinds)
    return windows if any(w is not None for w in windows) else ()


def sparse_mlp_layers(cfg: Mapping[str, Any], layers: int, model_type: str) -> tuple[int, ...]:
    """The layers whose MLP is sparse as ``mlp_layer_types`` lists them (``dense`` or ``sparse`` per layer; where
    absent, a dense first layer and sparse ones after, the default of the configs that have the key); a list of
    another length or kind is refused naming it."""
    kinds = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if len(kinds) != layers or set(kinds) - {"dense", "sparse"}:
        raise ModelLoadError(f"{model_type}: mlp_layer_types must list {layers} of dense, sparse; got {kinds}")
    return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")


def with_defaults(architecture: str, config_class: type, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` completed with transformers' defaults (``config_class``, e.g. ``Gemma2Config``), as transformers
    reads it; a config its validators refuse is a :class:`ModelLoadError` naming the family."""
    try:
        return config_class.from_dict(dict(cfg)).to_dict()
    except Exception as exc:  # its validators raise their own classes: any of them means a bad config
        raise ModelLoadError(f"{architecture}: config.json is not a {config_class.__name__} ({exc})") from exc


def query_temperature(cfg: Mapping[str, Any], model_type: str) -> tuple[float, int]:
    """``(llama_4_scaling_beta, original_max_position_embeddings)`` of a text model's rope parameters, as its
    attention reads them (transformers' ``Ministral3Attention`` and ``Mistral4Attention``: both required there);
    ``(0, 0)`` for a beta of 0."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    beta = params.get("llama_4_scaling_beta")
    if beta is None:
        raise ModelLoadError(f"{model_type}: rope_parameters has no llama_4_scaling_beta (its attention needs it)")
    if not float(beta):
        return 0.0, 0
    period = params.get("original_max_position_embeddings")
    if not period:
        raise ModelLoadError(f"{model_type}: llama_4_scaling_beta without original_max_position_embeddings in "
                             "rope_parameters")
    return float(beta), int(period)
