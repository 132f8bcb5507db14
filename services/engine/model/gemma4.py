"""Gemma 4 (Google, 2026): Gemma 3's layer of four norms with attention heads that differ by layer, KV shared across
layers, per-layer inputs and experts beside the MLP (:mod:`services.engine.model.gemma4_config`), served by
:mod:`services.engine.model.gemma4_decoder`.

Both checkpoints are read: ``Gemma4ForCausalLM`` (``gemma4_text``) and the multimodal ``Gemma4ForConditionalGeneration``
(``gemma4``: every release), whose text model is served and whose vision and audio towers and their embedders are never
read (:func:`gemma4_tensor_name`); and llama.cpp's ``gemma4`` GGUF files (:func:`config_from_gguf`). The encoder-free
Gemma 4 12B (``gemma4_unified``, ``Gemma4UnifiedForConditionalGeneration``, and its text model ``gemma4_unified_text``)
is the same text model without per-layer inputs or experts; its patch and audio-frame embedders are not read (text
served, as for the others). ``config.json`` is completed with transformers' own defaults (``Gemma4TextConfig``), which
give each full layer its ``global_head_dim`` (and, with ``attention_k_eq_v``, ``num_global_key_value_heads``) as
``per_layer_config``. Sliding layers rotate with their own plain rope; full layers with a proportional one
(:mod:`kernels.rope_frequencies`) over their wider heads. Attention is scaled by 1 (the q/k norms set the scale); values
are normed without a weight.

Refused by name: bidirectional attention over all tokens (an embedding model), an activation other than the tanh
GELU, attention biases, and per-layer inputs of a vocabulary smaller than the model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels.rope_scaling import RopeScaling
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig, windowed_layers
from services.engine.model.gemma3 import ACTIVATIONS
from services.engine.model.gemma4_config import Gemma4Config
from services.engine.model.gguf_config import TENSOR_NAMES_KEY, GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, rope_settings, typed_layer_windows, with_defaults
from services.engine.model.multimodal_text import VISION_PREFIXES, text_config, text_tensor_name

ARCHITECTURE = GGUF_ARCHITECTURE = "gemma4"
UNIFIED_TYPES = ("gemma4_unified", "gemma4_unified_text")  # the encoder-free checkpoints' (wrapper, text model)
LLAMA_CPP_SOFTCAP = 30.0  # llama.cpp's final logit softcap where a file has none (0 turns it off)
_NOT_READ = ("model.audio_tower.", "model.embed_audio.", "model.embed_vision.", "audio_tower.", "embed_audio.",
             "embed_vision.", "model.vision_embedder.", "vision_embedder.")  # (the last two: Gemma 4 12B's)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    text = _text_config(cfg)
    _refuse_unserved(text)
    layers = int(text["num_hidden_layers"])
    kinds = list(text["layer_types"])
    windows = typed_layer_windows(ARCHITECTURE, kinds, layers, text.get("sliding_window"))
    ropes = text["rope_parameters"]
    for kind in set(kinds):
        if not (ropes or {}).get(kind):
            raise ModelLoadError(f"gemma4: rope_parameters has no {kind} entry")
    local_theta, local_scaling = rope_settings({"rope_parameters": ropes.get("sliding_attention") or {}})
    if local_scaling is not None:
        raise ModelLoadError(f"gemma4: the sliding layers' rope must be plain, got {ropes['sliding_attention']}")
    fields = base_fields({**text, "rope_parameters": ropes["full_attention"]}, ARCHITECTURE, check_mlp=False)
    heads = _layer_heads(text, layers)
    sources = _kv_sources(kinds, int(text.get("num_kv_shared_layers") or 0))
    gemma4 = Gemma4Config(
        layer_heads=tuple(heads), kv_sources=sources,
        value_is_key=tuple(i for i, kind in enumerate(kinds) if kind == "full_attention")
        if text.get("attention_k_eq_v") else (),
        per_layer_input_size=int(text.get("hidden_size_per_layer_input") or 0),
        double_wide_layers=tuple(i for i in range(layers) if sources[i] != i) if text.get("use_double_wide_mlp")
        else (),
        moe_beside_mlp=bool(text.get("enable_moe_block")),
        final_logit_softcap=None if text.get("final_logit_softcapping") is None
        else float(text["final_logit_softcapping"]))
    moe = _experts(text, layers) if gemma4.moe_beside_mlp else None
    return _model_config(fields, gemma4, windows, local_theta, moe)


def _model_config(fields: dict[str, Any], gemma4: Gemma4Config, windows: tuple[int | None, ...], local_theta: float,
                  moe: MoEConfig | None) -> ModelConfig:
    """The config of a Gemma 4 model (``fields``: the shared ones, the full layers' rope among them): the KV slot is
    the widest KV-keeping layer's KV (see :mod:`services.engine.model.gemma4_config`)."""
    sources = gemma4.kv_sources
    owners = [gemma4.layer_heads[i] for i in range(len(sources)) if sources[i] == i]
    head_dim = max(dim for _, dim in gemma4.layer_heads)
    slot = max(h * d for h, d in owners)
    if slot % head_dim:
        raise ModelLoadError(f"gemma4: a KV slot of {slot} values does not hold whole heads of {head_dim}")
    return ModelConfig(
        **fields | {"num_kv_heads": slot // head_dim, "head_dim": head_dim}, qk_norm=True,
        layer_windows=windows, local_rope_layers=windowed_layers(windows), local_rope_theta=local_theta,
        moe=moe, gemma4=gemma4,
    )


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``gemma4`` file's config, read as its loader reads it: the layer kinds from
    ``attention.sliding_window_pattern``; KV heads and MLP widths per layer where the keys are arrays; the full
    layers' heads ``attention.key_length`` wide and the sliding ones' ``key_length_swa``; keys as values on a full
    layer without ``attn_v`` (:data:`TENSOR_NAMES_KEY`); the last ``attention.shared_kv_layers`` layers over an
    earlier layer's KV (llama.cpp's choice of layer, refused where it is not transformers'); the full layers'
    proportional rope from ``rope_freqs`` (:func:`~services.engine.weights.gguf_metadata.complete_config`); norms as
    stored (its converter adds nothing to them); its defaults where a key is missing (a logit softcap of 30, the
    sliding layers' rope base the full layers')."""
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    layers = int(f.key("block_count"))
    pattern = f.key("attention.sliding_window_pattern")
    if not isinstance(pattern, list | tuple) or len(pattern) != layers:
        raise ModelLoadError(f"GGUF gemma4: attention.sliding_window_pattern must list each of the {layers} layers, "
                             f"got {pattern!r}")
    kinds = ["sliding_attention" if sliding else "full_attention" for sliding in pattern]
    kv_heads = _per_layer(f, "attention.head_count_kv", layers, f.key("attention.head_count"))
    widths = _per_layer(f, "feed_forward_length", layers)
    full, sliding = int(f.key("attention.key_length")), int(f.key("attention.key_length_swa"))
    if (int(f.get("attention.value_length", full)), int(f.get("attention.value_length_swa", sliding))) != (full,
                                                                                                         sliding):
        raise ModelLoadError("GGUF gemma4: value widths differ from the key widths (llama.cpp refuses such a file)")
    if (int(f.get("rope.dimension_count", full)), int(f.get("rope.dimension_count_swa", sliding))) != (full, sliding):
        raise ModelLoadError("GGUF gemma4: a rope over part of a head other than rope_freqs' is not served "
                             f"(rope.dimension_count {f.get('rope.dimension_count')}, _swa "
                             f"{f.get('rope.dimension_count_swa')})")
    shared = int(f.get("attention.shared_kv_layers") or 0)
    sources = _kv_sources(kinds, shared)
    for layer in range(layers - shared, layers):  # llama.cpp's: the last KV layer, or the one before it if sliding
        theirs = layers - shared - (2 if kinds[layer] == "sliding_attention" else 1)
        if theirs != sources[layer]:
            raise ModelLoadError(f"GGUF gemma4: llama.cpp's layer {layer} attends over layer {theirs}'s KV, "
                                 f"transformers' over layer {sources[layer]}'s; such a file is not served")
    double = tuple(i for i in range(layers) if widths[i] != widths[0])
    if any(widths[i] != 2 * widths[0] or sources[i] == i for i in double):
        raise ModelLoadError(f"GGUF gemma4: feed_forward_length {widths} is not one width, doubled on KV-sharing "
                             "layers only")
    names = set(fields.get(TENSOR_NAMES_KEY, ()))
    base = gguf_base_fields({**fields, f"{GGUF_ARCHITECTURE}.attention.head_count_kv": max(kv_heads),
                             f"{GGUF_ARCHITECTURE}.feed_forward_length": widths[0]}, GGUF_ARCHITECTURE)
    softcap = f.get("final_logit_softcapping", LLAMA_CPP_SOFTCAP)  # 0: none
    gemma4 = Gemma4Config(
        layer_heads=tuple((kv_heads[i], sliding if kinds[i] == "sliding_attention" else full) for i in range(layers)),
        kv_sources=sources,
        value_is_key=tuple(i for i in range(layers) if kinds[i] == "full_attention" and sources[i] == i
                           and f"blk.{i}.attn_k.weight" in names and f"blk.{i}.attn_v.weight" not in names),
        per_layer_input_size=int(f.key("embedding_length_per_layer_input")), double_wide_layers=double,
        moe_beside_mlp=bool(f.get("expert_count")), final_logit_softcap=float(softcap) if softcap else None)
    moe = None
    if gemma4.moe_beside_mlp:
        moe = MoEConfig(num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
                        intermediate_size=int(f.key("expert_feed_forward_length")), norm_topk_prob=True,
                        sparse_layers=tuple(range(layers)), float32_expert_weights=True)
    windows = typed_layer_windows(f"GGUF {GGUF_ARCHITECTURE}", kinds, layers, f.get("attention.sliding_window"))
    base |= {"architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields),
             "rope_scaling": RopeScaling(rope_type="proportional")}  # rotated_fraction: rope_freqs' (complete_config)
    return _model_config(base, gemma4, windows, float(f.get("rope.freq_base_swa", base["rope_theta"])), moe)


def _per_layer(f: GGUFFields, name: str, layers: int, default: Any = None) -> list[int]:
    """A key llama.cpp reads with ``get_key_or_arr``: one number for every layer, or a list of one per layer."""
    value = f.key(name, default)
    values = list(value) if isinstance(value, list | tuple) else [value] * layers
    if len(values) != layers:
        raise ModelLoadError(f"GGUF gemma4: {name} lists {len(values)} values for {layers} layers")
    return [int(v) for v in values]


def gemma4_tensor_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model, None for the vision and audio towers' and their embedders'."""
    if name.startswith(_NOT_READ) or name.startswith(VISION_PREFIXES):
        return None
    return text_tensor_name(name)


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's config as transformers completes it: ``Gemma4TextConfig``'s, or, for the encoder-free
    ``gemma4_unified`` checkpoints (Gemma 4 12B: no per-layer inputs, no experts; their vision and audio embedders
    not read), ``Gemma4UnifiedTextConfig``'s."""
    from transformers import Gemma4TextConfig, Gemma4UnifiedTextConfig

    unified = cfg.get("model_type") in UNIFIED_TYPES
    text = text_config(cfg, UNIFIED_TYPES[0] if unified else "gemma4", default_tie=True)
    text["model_type"] = UNIFIED_TYPES[1] if unified else "gemma4_text"
    return with_defaults(ARCHITECTURE, Gemma4UnifiedTextConfig if unified else Gemma4TextConfig, text)


def _refuse_unserved(text: Mapping[str, Any]) -> None:
    if text.get("hidden_activation") not in ACTIVATIONS:
        raise ModelLoadError(f"gemma4: hidden_activation {text.get('hidden_activation')!r} is not supported "
                             f"(only {', '.join(ACTIVATIONS)})")
    if text.get("use_bidirectional_attention") == "all":
        raise ModelLoadError("gemma4: use_bidirectional_attention 'all' (an embedding model) is not supported")
    if text.get("attention_bias"):
        raise ModelLoadError("gemma4: attention_bias is not supported")
    if text.get("hidden_size_per_layer_input") and int(text["vocab_size_per_layer_input"]) < int(text["vocab_size"]):
        raise ModelLoadError(f"gemma4: vocab_size_per_layer_input {text['vocab_size_per_layer_input']} is smaller "
                             f"than vocab_size {text['vocab_size']} (a token would have no per-layer input)")


def _layer_heads(text: Mapping[str, Any], layers: int) -> list[tuple[int, int]]:
    """Each layer's (KV heads, head dim): the config's, overridden by ``per_layer_config`` (keyed by layer index,
    written ``"05"`` by transformers); the layers of a kind share one width (their rope's), or the config is refused."""
    overrides = {int(key): own for key, own in (text.get("per_layer_config") or {}).items()}
    heads = []
    for layer in range(layers):
        own = overrides.get(layer) or {}
        heads.append((int(own.get("num_key_value_heads") or text["num_key_value_heads"]),
                      int(own.get("head_dim") or text["head_dim"])))
    kinds = list(text["layer_types"])
    for kind in set(kinds):
        widths = {heads[i][1] for i in range(layers) if kinds[i] == kind}
        if len(widths) > 1:
            raise ModelLoadError(f"gemma4: the {kind} layers' heads differ in width {sorted(widths)} (one rope a kind)")
    return heads


def _kv_sources(kinds: list[str], shared: int) -> tuple[int, ...]:
    """Each layer's KV source (transformers' ``kv_sharing_modes``): the last ``shared`` layers attend over the last
    earlier layer of their kind, the others over their own."""
    first_shared = len(kinds) - shared
    if shared and (first_shared < 1 or not set(kinds[first_shared:]) <= set(kinds[:first_shared])):
        raise ModelLoadError(f"gemma4: num_kv_shared_layers {shared} leaves a shared layer no earlier layer of its "
                             f"kind to share (layer_types {kinds})")
    last = {kind: max(i for i in range(first_shared) if kinds[i] == kind) for kind in set(kinds[:first_shared])}
    return tuple(i if i < first_shared else last[kinds[i]] for i in range(len(kinds)))


def _experts(text: Mapping[str, Any], layers: int) -> MoEConfig:
    """Every layer's experts (beside its dense MLP): top-k of a softmax, renormalised (the router's own scale per
    expert is the decoder's), each expert's output times its float32 weight."""
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        if not text.get(key):
            raise ModelLoadError(f"gemma4: enable_moe_block needs {key}")
    return MoEConfig(num_experts=int(text["num_experts"]), top_k=int(text["top_k_experts"]),
                     intermediate_size=int(text["moe_intermediate_size"]), norm_topk_prob=True,
                     sparse_layers=tuple(range(layers)), float32_expert_weights=True)
