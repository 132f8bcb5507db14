"""The decoder's fused-ops path on the CPU, over the torch stand-in for flashinfer (``tests/kernels/
fake_flashinfer.py``, which makes a CPU model eligible): its logits are the torch path's within bf16 rounding (Llama,
Qwen3's q/k norms, llama3 rope scaling, GLM-4's interleaved rope and sandwich norms, mixture-of-experts layers, a
local rope beside the fused one, a decode step over the prefill's KV, decode-graph replays); the torch path is the
pre-fusion forward bit for bit (the models it knew); which ops a model takes, and the log lines that say so. The real
kernels: ``tests/kernels/test_fused_ops_gpu.py``."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import structlog.testing
import torch
import torch.nn.functional as F

from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import create_backend
from kernels.fused_ops import OPS
from kernels.linear import linear
from kernels.norm import rms_norm
from kernels.rope import RotaryEmbedding
from kernels.rope_scaling import RopeScaling
from services.engine.config import EngineConfig
from services.engine.decode_graphs import GraphOptions, eager_capture
from services.engine.model.config import MoEConfig
from services.engine.model.decoder import DecoderModel
from services.engine.model.fused_choice import choose_fused_ops, ineligible
from services.engine.model.moe import moe_forward
from services.engine.model_runner import ModelRunner
from services.engine.random_llama import PRESETS, random_tensors
from tests.engine.graph_replay import replays_beside_eager
from tests.kernels import fake_flashinfer

TINY = PRESETS["tiny"]
BLOCK = 4
CONFIGS = {
    "llama": TINY,
    "qwen3": replace(TINY, architecture="qwen3", qk_norm=True),
    "llama3-scaled": replace(TINY, rope_scaling=RopeScaling("llama3", factor=8.0, original_max_position=256)),
    # GLM-4: interleaved rope over half of each head, a norm on each block's output
    "glm4": replace(TINY, architecture="glm4", rotary_dim=TINY.head_dim // 2, rope_interleaved=True,
                    sandwich_norms=True),
    "moe": replace(TINY, architecture="qwen3_moe", moe=MoEConfig(num_experts=4, top_k=2, intermediate_size=48,
                                                                 norm_topk_prob=True, sparse_layers=(1,))),
    # Mellum's and Granite SWA's: a layer rotating with a plain rope of its own (torch's) beside the fused one
    "local-rope": replace(TINY, local_rope_layers=(0,), local_rope_theta=500.0),
}


def tensors(config, seed: int = 0) -> dict[str, torch.Tensor]:
    """``random_tensors``, with a sparse layer's router and experts where ``config`` has them, norm weights
    that are not all ones, and q/k projections large enough that attention is sharp (random_tensors' scores
    are ~0.05: attention averages, and no position, rotated or not, would change the logits)."""
    found = random_tensors(replace(config, moe=None), torch.float32, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, tensor in found.items():
        if name.endswith("norm.weight"):
            tensor.add_(torch.randn(tensor.shape, generator=gen) / 4)
        elif name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor.mul_(6)
    for layer in config.moe.sparse_layers if config.moe else ():
        p, moe = f"model.layers.{layer}.mlp.", config.moe
        for part in ("gate_proj", "up_proj", "down_proj"):
            del found[p + part + ".weight"]
        found[p + "gate.weight"] = torch.randn(moe.num_experts, config.hidden_size, generator=gen) * 0.2
        for j in range(moe.num_experts):
            e = f"{p}experts.{j}."
            found[e + "gate_proj.weight"] = torch.randn(moe.intermediate_size, config.hidden_size, generator=gen) / 50
            found[e + "up_proj.weight"] = torch.randn(moe.intermediate_size, config.hidden_size, generator=gen) / 50
            found[e + "down_proj.weight"] = torch.randn(config.hidden_size, moe.intermediate_size, generator=gen) / 50
    return found


def model(config, dtype=torch.bfloat16, **options) -> DecoderModel:
    return DecoderModel(config, tensors(config), dtype, **options)


def prefill_then_decode(m: DecoderModel, prompt: list[int], token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of every prompt position, then of one decode step over the prompt's KV."""
    cfg, n = m.config, len(prompt)
    blocks = [list(range(-(-(n + 1) // BLOCK)))]
    kv = list(torch.zeros(cfg.num_layers, len(blocks[0]), 2, BLOCK, cfg.num_kv_heads, cfg.head_dim,
                          dtype=m.dtype).unbind(0))
    attention = create_backend("torch", "cpu")
    with torch.inference_mode():
        attention.plan(AttentionMetadata.build([n], [n], blocks, BLOCK, "cpu"))
        prefill = m.forward(torch.tensor(prompt), torch.arange(n), kv, attention, torch.arange(n))
        attention.plan(AttentionMetadata.build([1], [n + 1], blocks, BLOCK, "cpu"))
        decode = m.forward(torch.tensor([token]), torch.tensor([n]), kv, attention, torch.tensor([0]))
    return prefill, decode


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_logits_are_the_torch_paths_within_bf16_rounding(name: str) -> None:
    config = CONFIGS[name]
    fused = model(config, flashinfer_module=fake_flashinfer)
    assert fused.ops.flashinfer == OPS
    reference = model(config, torch.float32)
    prompt = torch.randint(0, config.vocab_size, (23,), generator=torch.Generator().manual_seed(5)).tolist()
    want = prefill_then_decode(reference, prompt, 17)
    torch_path = prefill_then_decode(model(config), prompt, 17)
    for got, bf16, exact in zip(prefill_then_decode(fused, prompt, 17), torch_path, want, strict=True):
        fused_error, torch_error = (got - exact).abs(), (bf16 - exact).abs()
        assert (got - bf16).abs().max() < 0.05 * exact.abs().max(), name  # bf16 rounding, not a wrong op
        assert fused_error.mean() <= 1.5 * torch_error.mean(), (name, fused_error.mean(), torch_error.mean())


def pre_fusion_forward(m: DecoderModel, input_ids, positions, kv_caches, attention, logits_indices):
    """``DecoderModel.forward`` as it was before the fused ops (the reference for the torch path's bits)."""
    cfg = m.config
    hidden = F.embedding(input_ids, m.embed)
    cos, sin = m.rope.tables(positions, m.dtype)
    num_tokens = input_ids.shape[0]
    for layer, kv_cache in zip(m.layers, kv_caches, strict=True):
        x = rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
        q, k, v = linear(x, layer.qkv).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(num_tokens, cfg.num_heads, cfg.head_dim)
        k = k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        q = RotaryEmbedding.apply(q, cos, sin)
        k = RotaryEmbedding.apply(k, cos, sin)
        v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        attn = attention.forward(q, k, v, kv_cache, m.scale)
        hidden = hidden + linear(attn.reshape(num_tokens, cfg.q_size), layer.o)
        x = rms_norm(hidden, layer.post_norm, cfg.rms_norm_eps)
        if layer.moe is not None:
            hidden = hidden + moe_forward(x, layer.moe, cfg.moe)
        else:
            gate, up = linear(x, layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + linear(F.silu(gate) * up, layer.down)
    last = rms_norm(hidden[logits_indices], m.final_norm, cfg.rms_norm_eps)
    return linear(last, m.lm_head).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(set(CONFIGS) - {"glm4", "local-rope"}))  # (they came after the fusion)
def test_the_torch_path_is_the_pre_fusion_forward_bit_for_bit(name: str, dtype: torch.dtype,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    m = model(CONFIGS[name], dtype)
    assert m.ops.flashinfer == () and m.ops.fused_add_rmsnorm is None
    prompt = list(range(3, 60, 3))
    got = prefill_then_decode(m, prompt, 11)
    monkeypatch.setattr(DecoderModel, "forward", pre_fusion_forward)
    want = prefill_then_decode(m, prompt, 11)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_decode_graph_replays_of_the_fused_path_give_the_eager_logits() -> None:
    """Through the graph runner's fixed buffers (positions a slice of one, the in-place ops on the replayed
    forward's own tensors), with the stand-in's graph attention, as the GPU would capture it."""
    config = replace(TINY, num_heads=2, num_kv_heads=1, head_dim=64)  # a head dim flashinfer's attention runs
    fused, plain = model(config, flashinfer_module=fake_flashinfer), model(config)
    options = GraphOptions(max_num_seqs=4, max_model_len=64, capture=eager_capture, attention="flashinfer",
                           flashinfer_module=fake_flashinfer)
    graphed, eager = ModelRunner(fused, 32, BLOCK, "torch", graphs=options), ModelRunner(plain, 32, BLOCK, "torch")
    # buckets 1, 4 (padded), 4, and 4 again (a replay over used buffers)
    for _, got, want in replays_beside_eager(graphed, eager, plain, (1, 3, 4, 3), BLOCK):
        assert (got - want).abs().max() < 0.05 * want.abs().max()


@pytest.mark.parametrize(("options", "why"), [
    ({"dtype": torch.float32}, "torch.float32 keeps the torch ops"),
    ({"deterministic": True}, "deterministic mode"),
    ({"fused_ops": False}, "turned off"),
])
def test_float32_deterministic_and_turned_off_models_keep_the_torch_ops(options, why: str) -> None:
    dtype = options.pop("dtype", torch.bfloat16)
    with structlog.testing.capture_logs() as logs:
        m = model(TINY, dtype, flashinfer_module=fake_flashinfer, **options)
    assert m.ops.flashinfer == () and m.ops.fused_add_rmsnorm is None
    assert logs == []  # a CPU model: nothing to say
    assert why in ineligible(torch.device("cuda"), dtype, enabled=options.get("fused_ops", True),
                             deterministic=options.get("deterministic", False), stand_in=True)


def test_a_cpu_model_never_imports_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # importing it would raise
    m = model(TINY)
    assert m.ops.flashinfer == ()
    assert "is not a CUDA device" in ineligible(torch.device("cpu"), torch.bfloat16, enabled=True,
                                                deterministic=False, stand_in=False)


def test_the_engine_config_turns_them_off() -> None:
    assert EngineConfig(model_path="x").fused_ops is True
    assert EngineConfig(model_path="x", fused_ops=False).fused_ops is False


def test_a_cuda_model_without_flashinfer_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    rope = RotaryEmbedding(TINY.head_dim, 64, 10000.0)
    with structlog.testing.capture_logs() as logs:
        ops = choose_fused_ops(TINY, rope, torch.bfloat16, torch.device("cuda"))
    assert ops.flashinfer == ()
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("info", "fused ops: none, torch runs every elementwise op")]
    assert "importing flashinfer failed" in logs[0]["why"]


def test_a_failed_check_falls_back_per_op_and_is_logged() -> None:
    def broken(input):
        raise RuntimeError("undefined symbol: silu_and_mul")

    stand_in = type(sys)("flashinfer_stand_in")
    stand_in.__dict__.update({k: v for k, v in vars(fake_flashinfer).items() if not k.startswith("__")})
    stand_in.silu_and_mul = broken
    with structlog.testing.capture_logs() as logs:
        m = model(CONFIGS["moe"], flashinfer_module=stand_in)
    assert m.ops.flashinfer == ("fused_add_rmsnorm", "rope")
    warning, info = logs
    assert warning["log_level"] == "warning" and warning["op"] == "silu_and_mul"
    assert warning["why"] == "raised RuntimeError: undefined symbol: silu_and_mul"
    assert info["log_level"] == "info" and info["event"] == "fused ops: chosen"
    assert info["flashinfer"] == ["fused_add_rmsnorm", "rope"] and info["torch"] == ["silu_and_mul"]
    with structlog.testing.capture_logs() as logs:
        model(TINY, flashinfer_module=fake_flashinfer)
    assert [e["log_level"] for e in logs] == ["info"] and logs[0]["flashinfer"] == list(OPS)
    assert logs[0]["torch"] == []


def test_the_nodes_flag_turns_them_off_and_names_a_bad_value() -> None:
    from services.decode_node.config import DecodeNodeConfig
    from services.prefill_node.config import PrefillNodeConfig

    assert DecodeNodeConfig().engine_config().fused_ops and PrefillNodeConfig().engine_config().fused_ops
    assert not DecodeNodeConfig(fused_ops="off").engine_config().fused_ops
    assert not PrefillNodeConfig(fused_ops="off").engine_config().fused_ops
    with pytest.raises(ValueError, match="fused_ops must be one of on, off, got 'maybe'"):
        DecodeNodeConfig(fused_ops="maybe")


def test_a_partial_rotary_model_fuses_its_rope_over_the_rotated_dims() -> None:
    """Phi-4-mini rotates 3/4 of each head: FlashInfer's cache is that wide, which its kernel reads as the dims it
    rotates (the rest pass through); the rope passes its load check and the logits are the torch path's."""
    config = replace(TINY, rotary_dim=TINY.head_dim // 2)
    with structlog.testing.capture_logs() as logs:
        fused = model(config, flashinfer_module=fake_flashinfer)
    assert fused.ops.flashinfer == OPS and not [entry for entry in logs if entry["log_level"] == "warning"]
    prompt = [(i * 7) % TINY.vocab_size for i in range(12)]
    for got, plain in zip(prefill_then_decode(fused, prompt, 17), prefill_then_decode(model(config), prompt, 17),
                          strict=True):
        assert (got - plain).abs().max() < 0.05 * plain.abs().max()
