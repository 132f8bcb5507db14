"""Greedy reference generations from ``transformers`` on the same GGUF file, in float32."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

MARGIN_TOLERANCE = 0.02


@dataclass(frozen=True)
class Reference:
    token_ids: list[int]
    margins: list[float]  # top-1 minus top-2 logit at each generated step


def load_hf_model(gguf_path: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def greedy_reference(model, prompt_ids: list[int], max_new_tokens: int) -> Reference:
    """Plain greedy decoding with the model's own KV cache; EOS is an ordinary token (like ignore_eos)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    inputs = torch.tensor([prompt_ids])
    tokens, margins = [], []
    for _ in range(max_new_tokens):
        logits = model(input_ids=inputs, past_key_values=cache, use_cache=True).logits[0, -1].float()
        top2 = logits.topk(2)
        tokens.append(int(top2.indices[0]))
        margins.append(float(top2.values[0] - top2.values[1]))
        inputs = torch.tensor([[tokens[-1]]])
    return Reference(tokens, margins)


def first_divergence(expected: list[int], actual: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(expected, actual, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(actual) else min(len(expected), len(actual))
