"""Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU, optionally tied embeddings) over a paged KV cache.

The model is a plain object holding fused weight tensors (q/k/v in one matrix, gate/up in one matrix),
not an ``nn.Module``: a decode step is ~15 torch calls per layer and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kernels.int4_linear import GroupQuantized, int4_supported
from kernels.linear import LinearWeight, linear, prepare_linear
from kernels.norm import rms_norm
from kernels.rope import RotaryEmbedding
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: LinearWeight  # [q_size + 2 * kv_size, hidden]
    o: LinearWeight
    post_norm: torch.Tensor
    gate_up: LinearWeight  # [2 * intermediate, hidden]
    down: LinearWeight


class LlamaModel:
    """``quantized``: 4-bit codes of some weights (a Q4 GGUF file's own); with ``int4_max_rows`` > 0, where
    torch's int4 kernel runs (bf16 on CPU), projections of at most that many rows use them.
    ``self.int4_max_rows`` is what is in effect (0: every product is dense)."""

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu", quantized: dict[str, GroupQuantized] | None = None,
                 int4_max_rows: int = 0):
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        usable = bool(quantized) and int4_max_rows > 0 and int4_supported(self.device, dtype)
        quantized = quantized if usable else {}
        self.int4_max_rows = int4_max_rows if usable else 0

        def take(name: str) -> torch.Tensor:
            if name not in tensors:
                raise ModelLoadError(f"weights lack tensor {name!r}")
            return tensors[name].to(device=self.device, dtype=dtype).contiguous()

        self.embed = take("model.embed_tokens.weight")
        if self.embed.shape != (config.vocab_size, config.hidden_size):
            raise ModelLoadError(f"embedding shape {tuple(self.embed.shape)} does not match the config")
        self.final_norm = take("model.norm.weight")
        self.lm_head = prepare_linear(self.embed if config.tie_word_embeddings else take("lm_head.weight"))

        def projection(names: list[str]) -> LinearWeight:
            """The fused projection of ``names`` (stacked along output rows), with its 4-bit form when
            every part has one (the codes are packed, not kept)."""
            dense = torch.cat([take(name) for name in names]) if len(names) > 1 else take(names[0])
            if not all(name in quantized for name in names):
                return prepare_linear(dense)
            codes = GroupQuantized.cat([quantized[name] for name in names])
            return prepare_linear(dense, int4=codes, int4_max_rows=self.int4_max_rows)

        self.layers = [self._layer(take, projection, i) for i in range(config.num_layers)]
        self.rope = RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta, self.device)
        self.scale = config.head_dim**-0.5

    @staticmethod
    def _layer(take, projection, i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        return LayerWeights(
            input_norm=take(p + "input_layernorm.weight"),
            qkv=projection([p + f"self_attn.{n}_proj.weight" for n in "qkv"]),
            o=projection([p + "self_attn.o_proj.weight"]),
            post_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=projection([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
            down=projection([p + "mlp.down_proj.weight"]),
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attention: AttentionBackend, logits_indices: torch.Tensor) -> torch.Tensor:
        """Run one step over the concatenated new tokens of a batch (attention already planned).

        Returns float32 logits ``[len(logits_indices), vocab]`` for the token positions that sample.
        """
        cfg = self.config
        hidden = F.embedding(input_ids, self.embed)
        cos, sin = self.rope.tables(positions, self.dtype)
        num_tokens = input_ids.shape[0]
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
            q, k, v = linear(x, layer.qkv).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = RotaryEmbedding.apply(q.view(num_tokens, cfg.num_heads, cfg.head_dim), cos, sin)
            k = RotaryEmbedding.apply(k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            attn = attention.forward(q, k, v, kv_cache, self.scale)
            hidden = hidden + linear(attn.reshape(num_tokens, cfg.q_size), layer.o)
            x = rms_norm(hidden, layer.post_norm, cfg.rms_norm_eps)
            gate, up = linear(x, layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + linear(F.silu(gate) * up, layer.down)
        last = rms_norm(hidden[logits_indices], self.final_norm, cfg.rms_norm_eps)
        return linear(last, self.lm_head).float()
