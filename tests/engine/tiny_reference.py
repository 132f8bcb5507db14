"""The transformers side of the tiny checkpoints (tests/engine/tiny_families.py): the class that loads each, the
released layout a family's files are rewritten in where transformers 5 saves another, and the greedy reference
(argmax of a full forward at each step, no KV cache)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

# the transformers class of a checkpoint type AutoModelForCausalLM does not take (a vision-language model's)
AUTO_CLASSES = {name: "AutoModelForImageTextToText" for name in ("mistral3", "qwen3_vl", "qwen3_vl_moe", "qwen2_5_vl",
                                                                      "gemma4", "kimi_k25", "exaone4_5",
                                                                      "cohere_compass")}


def _transposed_experts(path: Path) -> None:
    """Qwen3-VL-MoE's released layout: each stacked expert tensor with its last two dims swapped."""
    from safetensors.torch import load_file, save_file

    for file in path.glob("*.safetensors"):
        tensors = load_file(str(file))
        for name in [n for n in tensors if n.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))]:
            tensors[name] = tensors[name].transpose(1, 2).contiguous()
        save_file(tensors, str(file), metadata={"format": "pt"})


def _kimi_k25_layers(path: Path) -> None:
    """Kimi K2.5's released layout: its text model's layers under ``language_model.model.layers`` (transformers 5
    saves them as ``blocks``, its vision tower's name)."""
    from safetensors.torch import load_file, save_file

    for file in path.glob("*.safetensors"):
        tensors = load_file(str(file))
        renamed = {name.replace("language_model.model.blocks.", "language_model.model.layers."): tensor
                   for name, tensor in tensors.items()}
        save_file(renamed, str(file), metadata={"format": "pt"})
    index = path / "model.safetensors.index.json"
    if index.exists():
        index.write_text(index.read_text().replace("language_model.model.blocks.", "language_model.model.layers."))


def _axk1_release(path: Path) -> None:
    """A.X-K1's released files: routers without ``e_score_correction_bias`` (transformers starts them at zero) and a
    ``post_mlp_layernorm`` on the dense first layer too, which nothing reads."""
    from safetensors.torch import load_file, save_file

    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for file in sorted(path.glob("*.safetensors")):
        tensors = load_file(str(file))
        kept = {name: t for name, t in tensors.items() if not name.endswith("e_score_correction_bias")}
        if file.name == index["weight_map"]["model.embed_tokens.weight"]:
            kept["model.layers.0.post_mlp_layernorm.weight"] = torch.full((tensors["model.embed_tokens.weight"]
                                                                           .shape[1],), 7.0)
        save_file(kept, str(file), metadata={"format": "pt"})
    weight_map = {n: f for n, f in index["weight_map"].items() if not n.endswith("e_score_correction_bias")}
    weight_map["model.layers.0.post_mlp_layernorm.weight"] = index["weight_map"]["model.embed_tokens.weight"]
    index_path.write_text(json.dumps({**index, "weight_map": weight_map}))


# a tiny checkpoint rewritten in its family's released layout where transformers 5 saves another
HUB_LAYOUTS = {"qwen_vl-moe": _transposed_experts, "deepseek-kimi_k25": _kimi_k25_layers, "axk1": _axk1_release}


def auto_class(model_type: str):
    import transformers

    return getattr(transformers, AUTO_CLASSES.get(model_type, "AutoModelForCausalLM"))


def load_reference(path: Path):
    model_type = json.loads((path / "config.json").read_text())["model_type"]
    return auto_class(model_type).from_pretrained(str(path), dtype=torch.float32).eval()


@dataclass(frozen=True)
class Reference:
    token_ids: list[int]
    margins: list[float]


@torch.inference_mode()
def greedy_full_forward(model, prompt: list[int], new_tokens: int) -> Reference:
    """The argmax of a full forward of the prompt and the tokens so far, at each step, and its top-2 margin.

    Computed with few forwards: transformers' own cached greedy decoding proposes the steps left, and one full
    forward (no cache) of the prompt, the tokens so far and the proposal gives every step's logits at once (its
    attention is causal: a position's logits are those of the forward that ends there; the head runs on those
    positions alone, ``logits_to_keep``). Steps are taken while the proposal is the argmax; at the first that is not,
    the argmax is taken and the rest proposed again from there (a proposal that fails every time costs one forward a
    step, as the plain loop does). A rope whose tables depend on the forward's length (dynamic NTK, longrope) past
    its original context takes the plain loop: there a longer forward rotates the same positions otherwise."""
    ids, tokens, margins = list(prompt), [], []
    plain = _length_dependent_rope(model, len(prompt) + new_tokens)
    while len(tokens) < new_tokens:
        proposal = [] if plain else _proposal(model, ids, new_tokens - len(tokens))
        steps = len(proposal) + 1 if len(proposal) < new_tokens - len(tokens) else len(proposal)
        logits = model(input_ids=torch.tensor([ids + proposal[:steps - 1]]), logits_to_keep=steps).logits[0].float()
        for step, row in enumerate(logits):
            top2 = row.topk(2)
            tokens.append(int(top2.indices[0]))
            margins.append(float(top2.values[0] - top2.values[1]))
            ids.append(tokens[-1])
            if step >= len(proposal) or tokens[-1] != proposal[step]:
                break
    return Reference(tokens, margins)


def _length_dependent_rope(model, length: int) -> bool:
    """Whether ``model``'s rope tables for a forward of ``length`` tokens depend on that length (transformers'
    dynamic NTK and longrope past the original context)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kinds = [p for p in params.values() if isinstance(p, dict)] or [params]  # one per layer kind, or one
    for rope in kinds:
        if (rope or {}).get("rope_type", rope.get("type") if rope else None) in ("dynamic", "longrope"):
            original = rope.get("original_max_position_embeddings") or getattr(
                config, "original_max_position_embeddings", None) or config.max_position_embeddings
            if length > int(original):
                return True
    return False


def _proposal(model, ids: list[int], steps: int) -> list[int]:
    """transformers' greedy tokens after ``ids`` (with its KV cache; no EOS stop), at most ``steps``; none where its
    generation fails (the check then takes one step a forward)."""
    from transformers import GenerationConfig

    if steps <= 1:
        return []
    try:
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             generation_config=GenerationConfig(max_new_tokens=steps, min_new_tokens=steps,
                                                                do_sample=False, pad_token_id=0))
    except Exception:  # a family whose cached generation transformers does not run: the plain loop
        return []
    return [int(t) for t in out[0, len(ids):]]
