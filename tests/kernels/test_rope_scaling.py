"""cos/sin of every supported rope type equal transformers' rotary embedding for the same config."""

from __future__ import annotations

import pytest
import torch

from kernels.rope import RotaryEmbedding
from kernels.rope_scaling import RopeScaling, UnsupportedRopeError
from services.engine.model.hf_config import rope_settings

CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 512, "mscale": 1.0,
                    "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tables_equal_transformers(case):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    raw = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 2048, "rope_theta": 500000.0,
           "rope_scaling": CASES[case]}
    reference = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in raw.items() if v is not None}))
    positions = torch.arange(0, 2048, 7)
    cos_ref, sin_ref = reference(torch.zeros(1, 1, 64), positions[None])
    theta, scaling = rope_settings({"model_type": "llama", **raw})
    ours = RotaryEmbedding(64, 2048, theta, scaling=scaling)
    cos, sin = ours.tables(positions, torch.float32)
    torch.testing.assert_close(cos[:, 0], cos_ref[0], rtol=0, atol=1e-6)  # [cos | cos]
    torch.testing.assert_close(sin[:, 0, 32:], sin_ref[0, :, 32:], rtol=0, atol=1e-6)  # [-sin | sin]
    assert torch.equal(sin[:, 0, :32], -sin[:, 0, 32:])
    if case != "default" and case != "dynamic":  # the scaling changes the tables: the check can fail
        plain = RotaryEmbedding(64, 2048, theta)
        assert not torch.allclose(plain.tables(positions, torch.float32)[0], cos, atol=1e-3)


def test_an_unsupported_rope_type_is_refused_by_name():
    from services.engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="longrope"):
        rope_settings({"model_type": "llama", "max_position_embeddings": 4096,
                       "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})
    with pytest.raises(UnsupportedRopeError, match="original_max_position"):
        RopeScaling(rope_type="llama3", factor=8.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_apply_rotates_half_with_the_bits_of_the_half_by_half_form(dtype):
    rope = RotaryEmbedding(64, 4096, 500000.0)
    positions = torch.tensor([0, 1, 17, 1000, 4095])
    cos, sin = rope.tables(positions, dtype)
    x = torch.randn(5, 7, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    c, s = cos[..., :32], sin[..., 32:]  # the plain halves
    x1, x2 = x[..., :32], x[..., 32:]
    expected = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    assert torch.equal(RotaryEmbedding.apply(x, cos, sin), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_rotation_is_transformers_glm4_s(dtype):
    """GLM-4's rope: pairs of adjacent dims over the leading half of each head, bit for bit (float32) and as
    close as rounding allows (bf16); the rotate-half layout on the same tables is far from it."""
    from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb

    rope = RotaryEmbedding(64, 4096, 10000.0, rotary_dim=32, interleaved=True)
    positions = torch.tensor([0, 1, 17, 1000, 4095])
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(5, 4, 64, generator=gen).to(dtype), torch.randn(5, 2, 64, generator=gen).to(dtype)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
    angles = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)[None]  # transformers' [1, T, rotary] tables
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb.cos().to(dtype),
                                          emb.sin().to(dtype))
    want_q, want_k = want_q[0].transpose(0, 1), want_k[0].transpose(0, 1)
    cos, sin = rope.tables(positions, dtype)
    got_q, got_k = rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)
    tolerance = {} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(got_q, want_q, **(tolerance or {"rtol": 0, "atol": 0}))
    torch.testing.assert_close(got_k, want_k, **(tolerance or {"rtol": 0, "atol": 0}))
    assert not torch.allclose(RotaryEmbedding.apply(q, cos, sin).float(), got_q.float(), atol=1e-1)
