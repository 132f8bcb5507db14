"""The bundled GGUF's own 4-bit weights: decoded exactly, and the bf16 model on them is as accurate as dense."""

from __future__ import annotations

import pytest
import torch

from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import create_backend
from kernels.int4_linear import int4_supported
from services.engine.model.decoder import DecoderModel
from tests.conftest import make_engine

pytestmark = pytest.mark.slow
needs_int4 = pytest.mark.skipif(not int4_supported("cpu", torch.bfloat16), reason="no int4 CPU kernel in torch")


@pytest.fixture(scope="module")
def bf16_models(bundled_weights) -> tuple[DecoderModel, DecoderModel]:
    """(on the file's 4-bit weights for steps of up to 8 rows, dense)."""
    config, tensors = bundled_weights.config, bundled_weights.tensors
    return (DecoderModel(config, tensors, torch.bfloat16, quantized=bundled_weights.quantized, int4_max_rows=8),
            DecoderModel(config, tensors, torch.bfloat16))


def test_every_q4_tensor_decodes_to_exactly_the_dequantised_weight(bundled_weights):
    """Codes × scale + offset equal the gguf package's float32 dequantisation, q/k rows un-permuted too."""
    quantized = bundled_weights.quantized
    assert len(quantized) == 7 * bundled_weights.config.num_layers  # q, k, v, o, gate, up, down are Q4_1
    for name, codes in quantized.items():
        assert torch.equal(codes.dequantize(), bundled_weights.tensors[name]), name


def _logits(model: DecoderModel, ids: list[int]) -> torch.Tensor:
    cfg = model.config
    kv = torch.zeros(cfg.num_layers, 1, 2, 16, cfg.num_kv_heads, cfg.head_dim, dtype=model.dtype)
    attention = create_backend("torch", "cpu")
    attention.plan(AttentionMetadata.build([len(ids)], [len(ids)], [[0]], 16, "cpu"))
    with torch.inference_mode():
        return model.forward(torch.tensor(ids), torch.arange(len(ids)), list(kv.unbind(0)), attention,
                             torch.arange(len(ids)))


@needs_int4
def test_bf16_on_4bit_weights_is_as_close_to_float32_as_dense_bf16(bf16_models, fp32_model):
    ids = [504, 3575, 282, 4649, 314, 28, 1848, 30]  # "The capital of France is ..." (8 rows: int4 runs)
    int4, dense = bf16_models
    assert int4.int4_max_rows == 8 and dense.int4_max_rows == 0
    reference = _logits(fp32_model, ids)
    int4_error = (_logits(int4, ids) - reference).abs()
    dense_error = (_logits(dense, ids) - reference).abs()
    assert int4_error.mean() <= 2 * dense_error.mean(), (int4_error.mean(), dense_error.mean())
    assert int4_error.max() <= 2 * dense_error.max(), (int4_error.max(), dense_error.max())
    assert torch.equal(_logits(int4, ids).argmax(-1), reference.argmax(-1))


def test_float32_never_uses_the_4bit_weights(bundled_weights):
    model = DecoderModel(bundled_weights.config, bundled_weights.tensors, torch.float32,
                       quantized=bundled_weights.quantized, int4_max_rows=8)
    assert model.int4_max_rows == 0
    assert all(layer.qkv.int4 is None for layer in model.layers)


@needs_int4
def test_nodes_with_and_without_4bit_weights_never_share_kv(bf16_models, bundled_tokenizer):
    int4, dense = bf16_models
    assert make_engine(int4, bundled_tokenizer).fingerprint != make_engine(dense, bundled_tokenizer).fingerprint
