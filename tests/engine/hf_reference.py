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
    out = model.generate(
        torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0,
    )
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    margins = []
    for logits in out.logits:
        top2 = logits[0].float().topk(2).values
        margins.append(float(top2[0] - top2[1]))
    return Reference(tokens, margins)


def first_divergence(expected: list[int], actual: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(expected, actual, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(actual) else min(len(expected), len(actual))
