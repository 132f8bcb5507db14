"""DBRX's decoder (:mod:`services.engine.model.dbrx`): the LayerNorm decoder over its released tensors laid out as the
shared decoder reads them — ``transformer.*`` as ``model.*``, each block's ``norm_attn_norm.norm_1``/``norm_2`` as
its two norms (biases of 0: DBRX's have none), ``Wqkv`` as the fused ``qkv_proj``, ``ffn.router.layer`` as the
router, and each expert's rows of the stacked ``w1`` (gate), ``v1`` (up) and ``w2`` (down, stored ``[ffn, hidden]``)
as its own projections."""

from __future__ import annotations

import torch

from services.engine.model.config import ModelConfig
from services.engine.model.layernorm_decoder import LayerNormDecoderModel


class DbrxDecoderModel(LayerNormDecoderModel):
    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], *args, **kwargs):
        super().__init__(config, _as_shared_layout(config, tensors), *args, **kwargs)


def _as_shared_layout(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` in the shared decoder's names (see the module); a tensor it does not know keeps its name (and is
    refused as unused)."""
    moe, hidden = config.moe, config.hidden_size
    assert moe is not None
    out = {}
    for name, tensor in tensors.items():
        if name.startswith("transformer.blocks."):
            layer, rest = name.removeprefix("transformer.blocks.").split(".", 1)
            p = f"model.layers.{layer}."
            if rest in _BLOCK:
                out[p + _BLOCK[rest]] = tensor
            elif rest in _EXPERTS:
                rows = tensor.reshape(moe.num_experts, moe.intermediate_size, hidden)
                for j in range(moe.num_experts):
                    part = rows[j].t().contiguous() if rest.endswith("w2") else rows[j]
                    out[f"{p}mlp.experts.{j}.{_EXPERTS[rest]}.weight"] = part
            else:
                out[name] = tensor
        else:
            out[_TOP.get(name, name)] = tensor
    zeros = torch.zeros(hidden)
    for i in range(config.num_layers):
        out[f"model.layers.{i}.input_layernorm.bias"] = out[f"model.layers.{i}.post_attention_layernorm.bias"] = zeros
    out["model.norm.bias"] = zeros
    return out


_TOP = {"transformer.wte.weight": "model.embed_tokens.weight", "transformer.norm_f.weight": "model.norm.weight"}
_BLOCK = {"norm_attn_norm.norm_1.weight": "input_layernorm.weight",
          "norm_attn_norm.attn.Wqkv.weight": "self_attn.qkv_proj.weight",
          "norm_attn_norm.attn.out_proj.weight": "self_attn.o_proj.weight",
          "norm_attn_norm.norm_2.weight": "post_attention_layernorm.weight",
          "ffn.router.layer.weight": "mlp.gate.weight"}
_EXPERTS = {"ffn.experts.mlp.w1": "gate_proj", "ffn.experts.mlp.v1": "up_proj", "ffn.experts.mlp.w2": "down_proj"}
