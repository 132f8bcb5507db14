"""Beyond greedy tokens: the float32 logits of a prompt (every position, 64 tokens: past the twins' windows of 24) are
transformers' for the families whose logits are transformed after the head (scaled, divided, softcapped, biased), and
for the families added with the LayerNorm decoder, the second rope and the new routers — where the family test's
argmax would not see a wrong scale."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import exactness_probe

FAMILIES = ("granite", "granite_moe", "hyperclovax", "granite_swa", "granite_moe_swa", "cohere", "cohere2_moe",
            "gemma2", "gemma", "vaultgemma", "phimoe", "starcoder2", "jais2", "mellum", "kolibri1", "exaone_moe",
            "hunyuan-a13b", "sarvam_moe", "deepseek-sarvam_mla", "youtu", "helium", "internlm3", "flex_olmo",
            "nemotron", "phi", "stablelm-parallel")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_logits_are_transformers(name, family_dir):
    _, expected, logits = exactness_probe(family_dir(name), _prompts()["long"][:64])
    got = logits()
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (got - expected).abs().max()
