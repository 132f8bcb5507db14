"""A llama.cpp ``qwen35``/``qwen35moe`` file's Gated DeltaNet tensors laid out as transformers holds them (the GGUF
loader's hook, ``Family.gguf_tensors``), undoing what its converter did (the names and the norms' ``+ 1`` are undone
by the loader, :mod:`services.engine.weights.gguf_names`):

- ``ssm_a`` holds ``-exp(A_log)``: ``A_log = log(-ssm_a)``, in float32;
- the convolution weight was squeezed to ``[channels, taps]``: its channel dim comes back;
- the value heads were *tiled* (value head ``j`` of key head ``k`` at ``j * key_heads + k``) where transformers
  *groups* them by key head (at ``k * per_key + j``): every tensor with a row per value element or per value head
  (``in_proj_z``, the value rows of ``in_proj_qkv`` and of the convolution, ``in_proj_a``, ``in_proj_b``,
  ``A_log``, ``dt_bias``) is reordered by row, and ``out_proj``, which takes the value elements in, by column.
"""

from __future__ import annotations

import torch

from services.engine.errors import ModelLoadError
from services.engine.model.config import LinearAttention, ModelConfig


def grouped_from_tiled(spec: LinearAttention, head_dim: int = 1) -> torch.Tensor:
    """The permutation taking tiled rows (``head_dim`` rows a value head) to grouped: ``grouped = tiled[perm]``."""
    per_key = spec.value_heads // spec.key_heads
    tiled_of_grouped = torch.arange(spec.value_heads * head_dim).reshape(per_key, spec.key_heads, head_dim)
    return tiled_of_grouped.transpose(0, 1).reshape(-1)


def delta_net_from_gguf(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """``tensors`` (the GGUF loader's, under transformers' names) with each DeltaNet layer's laid out as
    transformers holds them (see the module)."""
    spec = config.linear_attention
    assert spec is not None, "a Qwen3.5 config has DeltaNet layers"
    per_value = grouped_from_tiled(spec, spec.value_head_dim)
    per_head = grouped_from_tiled(spec)
    key_rows = 2 * spec.key_heads * spec.key_head_dim  # q and k rows before the value rows, in their order
    out = dict(tensors)
    for i in spec.layers:
        d = f"model.layers.{i}.linear_attn."
        out[d + "A_log"] = torch.log(-out[d + "A_log"].float())[per_head]
        for name in ("dt_bias", "in_proj_a.weight", "in_proj_b.weight"):
            out[d + name] = out[d + name][per_head]
        out[d + "in_proj_z.weight"] = out[d + "in_proj_z.weight"][per_value]
        for name in ("in_proj_qkv.weight", "conv1d.weight"):
            rows = out[d + name]
            out[d + name] = torch.cat((rows[:key_rows], rows[key_rows:][per_value]))
        out[d + "conv1d.weight"] = out[d + "conv1d.weight"].unsqueeze(1)
        out[d + "out_proj.weight"] = out[d + "out_proj.weight"][:, per_value].contiguous()
    return out


def qwen3_next_from_gguf(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """``tensors`` of a llama.cpp ``qwen3next`` file with each DeltaNet layer's laid out as Qwen3.5's are in
    transformers: its converter split the fused ``in_proj_qkvz`` into ``attn_qkv`` and ``attn_gate`` in the checkpoint's
    value-head order (grouped by key head: nothing to reorder) and kept ``in_proj_ba`` fused (per key head, its value
    heads' b rows, then their a rows: ``ssm_ba``), split here; ``ssm_a`` and the convolution as Qwen3.5's. An older
    file's ``ssm_in`` is the checkpoint's fused ``in_proj_qkvz``: it and ``ssm_ba`` are left for the decoder to split
    as it splits a checkpoint's."""
    spec = config.linear_attention
    assert spec is not None, "a Qwen3-Next config has DeltaNet layers"
    per_key = spec.value_heads // spec.key_heads
    out = dict(tensors)
    for i in spec.layers:
        d = f"model.layers.{i}.linear_attn."
        if d + "in_proj_qkvz.weight" not in out:
            ba = out.pop(d + "in_proj_ba.weight")
            if ba.shape[0] != 2 * spec.value_heads:
                raise ModelLoadError(f"GGUF qwen3next: blk.{i}.ssm_ba has {ba.shape[0]} rows, the config needs "
                                     f"{2 * spec.value_heads}")
            b, a = ba.reshape(spec.key_heads, 2 * per_key, -1).split([per_key, per_key], dim=1)
            out[d + "in_proj_b.weight"], out[d + "in_proj_a.weight"] = b.reshape(spec.value_heads, -1), \
                a.reshape(spec.value_heads, -1)
        out[d + "A_log"] = torch.log(-out[d + "A_log"].float())
        out[d + "conv1d.weight"] = out[d + "conv1d.weight"].unsqueeze(1)
    return out
