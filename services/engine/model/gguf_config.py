"""Reading GGUF metadata (``{arch}.*`` keys) into :class:`ModelConfig`: the fields every family shares and
the rope settings (``rope.scaling.*``; Llama 3.1+'s per-dimension ``rope_freqs`` come from the tensor and
are added by the loader)."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from kernels.rope_scaling import RopeScaling, UnsupportedRopeError
from services.engine.errors import ModelLoadError

# Set by the GGUF loader from the file's tensors: the embedding's rows, else the token count. Read when the
# metadata lacks ``{arch}.vocab_size`` (llama.cpp's converters write it for some architectures only).
DERIVED_VOCAB_KEY = "pdserve.derived_vocab_size"
# Set by the GGUF loader: the ids of the tokens that end a turn in an architecture's chat format, found by their
# text, as llama.cpp finds them (converters write ``tokenizer.ggml.eot_token_id`` only sometimes): Gemma's
# ``<end_of_turn>`` (Gemma 4's ``<turn|>`` and ``<|tool_response>``, its generation config's EOS ids too); GPT-OSS's
# harmony ends, its generation_config's EOS ids (a final answer's ``<|return|>``, a tool call's ``<|call|>``, and
# ``<|endoftext|>``); Phi-3's and Phi-4-mini's ``<|end|>``, Phi-4's ``<|im_end|>``; Kimi K2's ``<|im_end|>`` (its
# generation config's EOS, where its tokenizer's is ``[EOS]``); GLM-4-0414's ``<|user|>`` and ``<|observation|>``;
# ChatML's ``<|im_end|>`` for SmolLM3, OLMo 3 and Nemotron-H (their files' EOS may be the base model's end of text).
TURN_END_KEY = "pdserve.turn_end_token_ids"
# Set by the GGUF loader: the names of the file's tensors, for an architecture whose config depends on which are there
# (llama.cpp's Gemma 4 has a full layer's values be its keys where the file has no ``attn_v``)
TENSOR_NAMES_KEY = "pdserve.tensor_names"
# Set by the GGUF loader: the values of ``rope_factors_short.weight`` (llama.cpp's Phi-3 longrope: the per-dimension
# divisors within the original context, the checkpoint's ``short_factor``), for the family's config to read
ROPE_SHORT_FACTORS_KEY = "pdserve.rope_short_factors"
TURN_END_TEXTS = {"deepseek2": ("<|im_end|>",), "glm4": ("<|user|>", "<|observation|>"),
                  "gemma": ("<end_of_turn>",), "gemma2": ("<end_of_turn>",), "gemma3": ("<end_of_turn>",),
                  "gemma4": ("<turn|>", "<|tool_response>"), "gpt-oss": ("<|return|>", "<|call|>", "<|endoftext|>"),
                  "llama4": ("<|eot|>", "<|eom|>", "<|end_of_text|>"),
                  "phi3": ("<|end|>", "<|im_end|>", "<|endoftext|>"),
                  "smollm3": ("<|im_end|>",), "olmo2": ("<|im_end|>",), "nemotron_h": ("<|im_end|>",),
                  "nemotron_h_moe": ("<|im_end|>",), "command-r": ("<|END_OF_TURN_TOKEN|>",),
                  "cohere2": ("<|END_OF_TURN_TOKEN|>",), "exaone4": ("[|endofturn|]",), "exaone": ("[|endofturn|]",),
                  "dots1": ("<|endofresponse|>",),
                  "hunyuan-dense": ("<\uff5chy_place\u2581holder\u2581no\u25812\uff5c>",)}
_GGUF_ROPE_TYPES = {"none": "default", "linear": "linear", "yarn": "yarn"}


class GGUFFields:
    """``fields`` of one architecture: ``key("block_count")`` reads ``{arch}.block_count``."""

    def __init__(self, fields: Mapping[str, Any], arch: str):
        self.fields, self.arch = fields, arch

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(f"{self.arch}.{name}", default)

    def decimal(self, name: str, default: float) -> float:
        """A float32 key as the decimal its checkpoint wrote (the shortest that is the same float32: 1.8, not
        1.7999999523…; 0.0078125 whole); ``default`` where it is missing or 0."""
        return float32_decimal(float(self.get(name) or default))

    def key(self, name: str, default: Any = None) -> Any:
        value = self.get(name, default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {self.arch}.{name}")
        return value

    def has_tensor(self, suffix: str) -> bool:
        """The file holds a tensor whose name ends with ``suffix`` (``".attn_q.bias"``; the names the loader sets
        under :data:`TENSOR_NAMES_KEY`)."""
        return any(name.endswith(suffix) for name in self.fields.get(TENSOR_NAMES_KEY, ()))


def float32_decimal(value: float) -> float:
    """The shortest decimal that rounds to the same float32 as ``value`` (a float32 read back as the number its
    writer meant)."""
    single = struct.unpack("<f", struct.pack("<f", value))[0]
    for digits in range(1, 10):
        shortest = float(f"{single:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", shortest))[0] == single:
            return shortest
    return single


SOFTMAX_GATING, SIGMOID_GATING = 1, 2  # llama.cpp's expert_gating_func values
_GATING_NAMES = {SOFTMAX_GATING: "softmax", SIGMOID_GATING: "sigmoid"}


def require_gating(f: GGUFFields, expected: int, model: str) -> None:
    """Refuses a file whose ``expert_gating_func`` is not the family's routing (``expected``; a file without the key
    routes so, as llama.cpp's loader defaults it for these families)."""
    gating = int(f.get("expert_gating_func") or expected)
    if gating != expected:
        raise ModelLoadError(f"GGUF {f.arch}: expert_gating_func {gating} is not supported ({model}'s routing is the "
                             f"{_GATING_NAMES[expected]}, {expected})")


def fields_as(fields: Mapping[str, Any], architecture: str, kin: str) -> dict[str, Any]:
    """``fields`` of an ``architecture`` file with its ``{architecture}.*`` keys named ``{kin}.*``: a file whose
    converter is ``kin``'s subclass, read as ``kin``'s."""
    prefix = architecture + "."
    return {kin + "." + key.removeprefix(prefix) if key.startswith(prefix) else key: value
            for key, value in fields.items()}


def gguf_rope(f: GGUFFields) -> RopeScaling | None:
    kind = str(f.get("rope.scaling.type", "none"))
    if kind not in _GGUF_ROPE_TYPES:
        raise ModelLoadError(f"GGUF rope scaling type {kind!r} is not supported (supported: "
                             f"{', '.join(_GGUF_ROPE_TYPES)})")
    if _GGUF_ROPE_TYPES[kind] == "default":
        return None
    original = f.get("rope.scaling.original_context_length")
    # yarn's settings where the converter wrote them (its generic writer: the checkpoint's betas and its
    # ``attention_factor`` as ``yarn_attn_factor``, older ones as ``attn_factor``); transformers' defaults otherwise.
    # The checkpoint's yarn is served, as transformers runs it: llama.cpp's runtime reads neither key for most
    # families (it runs betas 32 and 1 and derives the magnitude), which differs only where a checkpoint set them
    factor = f.get("rope.scaling.attn_factor", f.get("rope.scaling.yarn_attn_factor"))
    try:
        return RopeScaling(rope_type=_GGUF_ROPE_TYPES[kind], factor=float(f.key("rope.scaling.factor")),
                           original_max_position=None if original is None else int(original),
                           attention_factor=None if factor is None else float32_decimal(float(factor)),
                           beta_fast=f.decimal("rope.scaling.yarn_beta_fast", 32.0),
                           beta_slow=f.decimal("rope.scaling.yarn_beta_slow", 1.0))
    except UnsupportedRopeError as exc:
        raise ModelLoadError(f"GGUF {f.arch}: {exc}") from exc


def hf_rope_parameters(scaling: RopeScaling | None) -> dict[str, Any]:
    """:func:`gguf_rope`'s scaling as a ``config.json``'s ``rope_parameters`` entries (none: nothing), for a family
    whose GGUF config is read through its ``config.json`` reader."""
    if scaling is None:
        return {}
    entries: dict[str, Any] = {"rope_type": scaling.rope_type, "factor": scaling.factor,
                               "original_max_position_embeddings": scaling.original_max_position}
    if scaling.rope_type == "yarn":
        entries.update(beta_fast=scaling.beta_fast, beta_slow=scaling.beta_slow)
        if scaling.attention_factor is not None:
            entries["attention_factor"] = scaling.attention_factor
    return entries


def gguf_base_fields(fields: Mapping[str, Any], arch: str) -> dict[str, Any]:
    f = GGUFFields(fields, arch)
    hidden, heads = int(f.key("embedding_length")), int(f.key("attention.head_count"))
    eos = fields.get("tokenizer.ggml.eos_token_id")
    bos = fields.get("tokenizer.ggml.bos_token_id")
    vocab = f.get("vocab_size") or fields.get(DERIVED_VOCAB_KEY) or len(fields.get("tokenizer.ggml.tokens", []))
    if not vocab:
        raise ModelLoadError(f"GGUF metadata lacks {arch}.vocab_size, and the file has neither a token list nor "
                             "token_embd.weight to count it from")
    return dict(
        architecture=arch,
        name=str(fields.get("general.name", arch)),
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(f.get("feed_forward_length") or 0),
        num_layers=int(f.key("block_count")),
        num_heads=heads,
        num_kv_heads=_one_kv_head_count(f) or heads,
        head_dim=int(f.get("attention.key_length") or f.get("rope.dimension_count") or hidden // heads),
        rope_theta=float(f.get("rope.freq_base", 10000.0)),
        rope_scaling=gguf_rope(f),
        rms_norm_eps=float(f.key("attention.layer_norm_rms_epsilon")),
        max_position=int(f.key("context_length")),
        tie_word_embeddings=True,  # decided by the loader from the tensors present
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def gguf_sliding_layers(f: GGUFFields, layers: int, window: int, period: int) -> tuple[int | None, ...]:
    """Each layer's window (None: a full layer) as llama.cpp reads ``attention.sliding_window_pattern``: a flag a layer
    (true: it slides), or a period n (every n-th layer full; 0: every layer slides), or, where the file names none,
    the family's ``period``."""
    pattern = f.get("attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)):
        sliding = [bool(flag) for flag in pattern]
        if len(sliding) != layers:
            raise ModelLoadError(f"GGUF {f.arch}: attention.sliding_window_pattern lists {len(sliding)} layers, the "
                                 f"file has {layers}")
    else:
        every = period if pattern is None else int(pattern)
        sliding = [every == 0 or (i + 1) % every != 0 for i in range(layers)]
    return tuple(window if flag else None for flag in sliding)


def per_layer(f: GGUFFields, name: str) -> list[int]:
    """A key llama.cpp's hybrid files write per layer (``attention.head_count_kv``: 0 for a recurrent layer;
    Nemotron-H's ``feed_forward_length``: 0 but for an MLP block), or one number for every layer."""
    layers = int(f.key("block_count"))
    written = f.key(name)
    values = [int(n) for n in written] if isinstance(written, (list, tuple)) else [int(written)] * layers
    if len(values) != layers:
        raise ModelLoadError(f"GGUF {f.arch}: {name} lists {len(values)} layers, the file has {layers}")
    return values


def _one_kv_head_count(f: GGUFFields) -> int:
    """``attention.head_count_kv``: a number, or llama.cpp's per-layer array (its Granite 4.0 converter writes one
    even for the attention-only models, whose files it names ``granite``) of one count wherever a layer attends
    (0: a recurrent layer, its family's to read); 0 where absent."""
    written = f.get("attention.head_count_kv")
    if not isinstance(written, (list, tuple)):
        return int(written or 0)
    counts = {int(n) for n in written} - {0}
    if len(counts) > 1:
        raise ModelLoadError(f"GGUF {f.arch}: attention.head_count_kv differs across layers ({list(written)}); one "
                             "count is served")
    return counts.pop() if counts else 0


def gguf_layer_norm_fields(fields: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """:func:`gguf_base_fields` of a LayerNorm family's file (StarCoder2's, Nemotron's, Phi-2's), as llama.cpp's loader
    reads it: the norms' epsilon ``attention.layer_norm_epsilon``, the rotated part ``rope.dimension_count`` (the whole
    head where absent), the end ids :func:`gguf_turn_end_ids` gives, the architecture the family's own."""
    f = GGUFFields(fields, arch)
    eps = f.key("attention.layer_norm_epsilon")
    base = gguf_base_fields({**fields, f"{arch}.attention.layer_norm_rms_epsilon": eps}, arch)
    # the head: key_length, else hidden / heads as llama.cpp's loader takes it (these converters write no key_length
    # unless the checkpoint names a head_dim; rope.dimension_count is the rotated part only)
    head_dim = int(f.get("attention.key_length") or base["hidden_size"] // base["num_heads"])
    rotary = int(f.get("rope.dimension_count") or head_dim)
    return {**base, "head_dim": head_dim, "rotary_dim": None if rotary == head_dim else rotary,
            "eos_token_ids": gguf_turn_end_ids(base, fields)}


def gguf_turn_end_ids(base: Mapping[str, Any], fields: Mapping[str, Any]) -> tuple[int, ...]:
    """A GGUF file's end ids: its EOS, its ``eot_token_id`` and ``eom_token_id`` (llama.cpp ends generation at each:
    GLM's converter writes ``<|user|>`` and ``<|observation|>`` there) and the loader's :data:`TURN_END_KEY` ids (the
    tokens that end a chat turn)."""
    marked = (fields.get(f"tokenizer.ggml.{key}") for key in ("eot_token_id", "eom_token_id"))
    ends = (*base["eos_token_ids"], *(int(i) for i in marked if i is not None), *fields.get(TURN_END_KEY, ()))
    return tuple(dict.fromkeys(int(i) for i in ends))
