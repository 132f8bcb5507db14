"""GPT-OSS's decoder: the shared decoder (:class:`DecoderModel`, which reads each layer's attention sinks) with
GPT-OSS's experts.

Its experts are stored as transformers holds them: ``gate_up_proj [E, hidden, 2 * inter]`` with the gate and up
columns interleaved (gate even, up odd), ``down_proj [E, inter, hidden]``, each with a bias; OpenAI's checkpoints
store both in MXFP4 (``*_blocks`` and ``*_scales``), dequantised at load by transformers' own routine (every
value is exact in bfloat16); a llama.cpp GGUF file's are laid out so at load (:func:`experts_from_gguf`). Each
expert becomes a :class:`LinearWeight` of ``[gate rows; up rows]`` and one of
its down rows, so the shared per-expert loop (:func:`moe_forward`) runs them, with :func:`clamped_swiglu` as
the activation. The grouped-GEMM path has no biases: GPT-OSS always runs the loop.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from kernels.linear import LinearWeight, prepare_linear
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, LayerWeights
from services.engine.model.moe import MoEWeights, moe_forward

MXFP4_BLOCK = 32  # values per scale; two 4-bit values per byte


def clamped_swiglu(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """GPT-OSS's activation of ``[..., gate | up]``: ``(clamp(up, ±limit) + 1) * g * sigmoid(alpha * g)`` with
    ``g = min(gate, limit)``."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class GptOssDecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a GPT-OSS checkpoint (``config.attention_sinks``); same constructor, except
    that the experts never run as grouped GEMMs."""

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        assert config.moe is not None and config.moe.swiglu_limit is not None, "GptOssDecoderModel needs GPT-OSS's"
        kwargs["grouped_experts"] = False
        super().__init__(config, tensors, dtype, *args, **kwargs)
        self._activation = partial(clamped_swiglu, limit=config.moe.swiglu_limit, alpha=config.moe.swiglu_alpha)

    def _experts(self, p: str) -> MoEWeights:
        moe, hidden, source = self.config.moe, self.config.hidden_size, self._source
        assert moe is not None
        experts, inter = moe.num_experts, moe.intermediate_size
        router = prepare_linear(source.take(p + "router.weight", (experts, hidden)),
                                bias=source.take(p + "router.bias", (experts,)), row_block=self._row_block)
        gate_up = self._expert_stack(p + "experts.gate_up_proj", (experts, hidden, 2 * inter))
        gate_up_bias = source.take(p + "experts.gate_up_proj_bias", (experts, 2 * inter))
        down = self._expert_stack(p + "experts.down_proj", (experts, inter, hidden))
        down_bias = source.take(p + "experts.down_proj_bias", (experts, hidden))
        gate_ups: list[LinearWeight] = []
        downs: list[LinearWeight] = []
        for e in range(experts):  # [hidden, 2I] interleaved -> [gate rows; up rows] of [2I, hidden]
            rows = torch.cat([gate_up[e][:, 0::2].t(), gate_up[e][:, 1::2].t()]).contiguous()
            bias = torch.cat([gate_up_bias[e][0::2], gate_up_bias[e][1::2]])
            gate_ups.append(prepare_linear(rows, bias=bias, row_block=self._row_block, prompt_rows=False))
            downs.append(prepare_linear(down[e].t().contiguous(), bias=down_bias[e], row_block=self._row_block,
                                        prompt_rows=False))
        return MoEWeights(router, gate_ups, downs)

    def _expert_stack(self, name: str, shape: tuple[int, int, int]) -> torch.Tensor:
        """The experts' ``[E, in, out]`` tensor ``name``, from the checkpoint's floats or its MXFP4 blocks and
        scales (``[E, out, in / 32, 16]`` bytes and ``[E, out, in / 32]`` exponents)."""
        source = self._source
        if not source.has(name + "_blocks"):
            return source.take(name, shape)
        experts, inputs, outputs = shape
        if inputs % MXFP4_BLOCK:
            raise ModelLoadError(f"{name}: MXFP4 needs its input dim ({inputs}) in blocks of {MXFP4_BLOCK}")
        groups = inputs // MXFP4_BLOCK
        blocks = source.take_raw(name + "_blocks", (experts, outputs, groups, MXFP4_BLOCK // 2), torch.uint8)
        scales = source.take_raw(name + "_scales", (experts, outputs, groups), torch.uint8)
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        values = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)  # [E, in, out], exact in bf16
        return values.to(device=self.device, dtype=self.dtype)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights, paths: Any) -> torch.Tensor:
        assert layer.moe is not None and self.config.moe is not None
        return moe_forward(x, layer.moe, self.config.moe, self._activation)


def experts_from_gguf(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A llama.cpp ``gpt-oss`` file's experts laid out as transformers holds them (the GGUF loader's hook): its
    converter split ``gate_up_proj`` into ``ffn_gate_exps`` and ``ffn_up_exps`` (``[E, inter, hidden]``, biases
    ``[E, inter]``) and stores ``ffn_down_exps`` as ``[E, hidden, inter]``; here the gate and up columns are
    interleaved again (gate even, up odd) and down is ``[E, inter, hidden]``, so :meth:`GptOssDecoderModel._experts`
    reads either file alike."""
    out = dict(tensors)
    for i in range(config.num_layers):
        p = f"model.layers.{i}.mlp.experts."
        stacked = {name: out.pop(p + f"gguf_{name}", None) for name in ("gate.weight", "up.weight", "down.weight",
                                                                           "gate.bias", "up.bias", "down.bias")}
        missing = [f"blk.{i}.ffn_{name.replace('.', '_exps.')}" for name, t in stacked.items() if t is None]
        if missing:
            raise ModelLoadError(f"GGUF gpt-oss layer {i}: its experts lack {', '.join(missing)} (each of gate, up "
                                 "and down needs its weight and bias)")
        gate, up = _alike(stacked["gate.weight"], stacked["up.weight"])  # one MXFP4 (bf16), one not: float32
        out[p + "gate_up_proj"] = torch.stack((gate, up), dim=2).flatten(1, 2).transpose(1, 2)  # [E, hidden, 2I]
        out[p + "gate_up_proj_bias"] = torch.stack(_alike(stacked["gate.bias"], stacked["up.bias"]), dim=2).flatten(1)
        out[p + "down_proj"] = stacked["down.weight"].transpose(1, 2)  # [E, inter, hidden]
        out[p + "down_proj_bias"] = stacked["down.bias"]
    return out


def _alike(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` in the dtype that holds both exactly."""
    dtype = torch.promote_types(a.dtype, b.dtype)
    return a.to(dtype), b.to(dtype)
