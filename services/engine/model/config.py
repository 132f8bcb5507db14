"""Model architecture description shared by loaders, the model and the KV cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.engine.errors import ModelLoadError


@dataclass(frozen=True)
class ModelConfig:
    """Shape and constants of a Llama-family decoder."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"{self.num_heads} heads do not divide into {self.num_kv_heads} KV heads")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any]) -> ModelConfig:
        arch = fields.get("general.architecture")
        if arch != "llama":
            raise ModelLoadError(f"unsupported GGUF architecture {arch!r} (only 'llama')")

        def key(name: str, default: Any = None) -> Any:
            value = fields.get(f"llama.{name}", default)
            if value is None:
                raise ModelLoadError(f"GGUF metadata lacks llama.{name}")
            return value

        hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
        eos = fields.get("tokenizer.ggml.eos_token_id")
        return cls(
            name=str(fields.get("general.name", "llama")),
            vocab_size=int(key("vocab_size", len(fields.get("tokenizer.ggml.tokens", [])) or None)),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=heads,
            num_kv_heads=int(key("attention.head_count_kv", heads)),
            head_dim=int(key("rope.dimension_count", hidden // heads)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            max_position=int(key("context_length")),
            tie_word_embeddings=True,  # decided by the loader from the tensors present
            bos_token_id=_opt_int(fields.get("tokenizer.ggml.bos_token_id")),
            eos_token_ids=() if eos is None else (int(eos),),
        )

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in archs:
            raise ModelLoadError(f"unsupported model_type {cfg.get('model_type')!r} (only llama)")
        if cfg.get("rope_scaling"):
            raise ModelLoadError("rope_scaling is not supported yet")
        heads = int(cfg["num_attention_heads"])
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            name=str(cfg.get("_name_or_path") or "llama"),
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=_opt_int(cfg.get("bos_token_id")),
            eos_token_ids=eos_ids,
        )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
