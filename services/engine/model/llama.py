"""Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU, optionally tied embeddings) over a paged KV cache.

The model is a plain object holding fused weight tensors (q/k/v in one matrix, gate/up in one matrix),
not an ``nn.Module``: a decode step is ~15 torch calls per layer and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

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
    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)

        def take(name: str) -> torch.Tensor:
            if name not in tensors:
                raise ModelLoadError(f"weights lack tensor {name!r}")
            return tensors[name].to(device=self.device, dtype=dtype).contiguous()

        self.embed = take("model.embed_tokens.weight")
        if self.embed.shape != (config.vocab_size, config.hidden_size):
            raise ModelLoadError(f"embedding shape {tuple(self.embed.shape)} does not match the config")
        self.final_norm = take("model.norm.weight")
        self.lm_head = prepare_linear(self.embed if config.tie_word_embeddings else take("lm_head.weight"))
        self.layers = [self._layer(take, i) for i in range(config.num_layers)]
        self.rope = RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta, self.device)
        self.scale = config.head_dim**-0.5

    @staticmethod
    def _layer(take, i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        return LayerWeights(
            input_norm=take(p + "input_layernorm.weight"),
            qkv=prepare_linear(torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])),
            o=prepare_linear(take(p + "self_attn.o_proj.weight")),
            post_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=prepare_linear(torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])),
            down=prepare_linear(take(p + "mlp.down_proj.weight")),
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
