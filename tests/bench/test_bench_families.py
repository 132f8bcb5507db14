"""``make bench-families``: its machinery runs end to end on tiny checkpoints of both families (the figures of
such a run mean nothing), and its real shapes are the published models' (checked on the meta device)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from services.bench.families import SHAPES, SYSTEMS, floor_ms, main
from services.engine.model.registry import config_from_hf
from services.engine.random_llama import weight_bytes


def test_the_whole_benchmark_runs_on_tiny_shapes_alternating_both_systems(tmp_path: Path, capsys) -> None:
    out = tmp_path / "families.json"
    assert main(["--shapes", "tiny-qwen3", "tiny-llama", "tiny-gemma3", "tiny-qwen3.5", "--repeats", "2",
                 "--b1-context", "8", "--b1-steps", "3", "--batch", "3", "--batch-context", "12", "--batch-steps", "2",
                 "--prefill-tokens", "24", "--bandwidth-mib", "8", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["shape"] for r in results] == ["tiny-qwen3", "tiny-llama", "tiny-gemma3", "tiny-qwen3.5"]
    for result in results:
        runs = result["runs"]
        assert len(runs["bandwidth_gbs"]) == 2 and min(runs["bandwidth_gbs"]) > 0
        for system in SYSTEMS:
            for key in ("b1_ms", "batch_step_ms", "prefill_s"):
                assert len(runs[f"{system}.{key}"]) == 2 and min(runs[f"{system}.{key}"]) > 0
        assert 0 < result["floor_b1_ms"] < result["floor_batch_step_ms"]
        assert result["seconds"] > 0 and "cpu_stall_share" in result
    printed = capsys.readouterr().out
    assert printed.count("| bandwidth floor |") == 4 and "pdserve ÷ transformers" in printed


@pytest.mark.parametrize(("shape", "params", "architecture"),
                         [("qwen3-0.6b", 596_049_920, "qwen3"), ("llama-3.2-1b", 1_235_814_400, "llama"),
                          ("gemma-3-1b", 999_885_952, "gemma3"), ("gemma-2-2b", 2_614_341_888, "gemma2")])
def test_real_shapes_have_the_published_parameter_counts_and_the_floor_reads_every_matrix(
        shape: str, params: int, architecture: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES[shape])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == params
    cfg = config_from_hf(config.to_dict())
    assert cfg.architecture == architecture and cfg.tie_word_embeddings
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # norms are vectors
    assert weight_bytes(cfg, 2) == 2 * matrices
    assert floor_ms(cfg, 1e9, 1, 0) == pytest.approx(2 * matrices / 1e6)
    assert floor_ms(cfg, 1e9, 4, 10) - floor_ms(cfg, 1e9, 1, 0) == pytest.approx(40 * cfg.kv_bytes_per_token(2) / 1e6)
    if cfg.has_windows:  # past the window, the sliding layers' KV stops growing: Gemma 3's five layers of six
        full, window = sum(w is None for w in cfg.layer_windows), max(w or 0 for w in cfg.layer_windows)
        per_layer, context = cfg.kv_bytes_per_token(2) / cfg.num_layers, 2 * window
        assert floor_ms(cfg, 1e9, 1, context) - floor_ms(cfg, 1e9, 1, 0) == pytest.approx(
            (full * context + (cfg.num_layers - full) * window) * per_layer / 1e6)


def test_the_qwen3_5_floor_reads_every_matrix_the_attention_layers_kv_and_each_state_twice() -> None:
    """Qwen3.5-0.8B's text model (752 M parameters here): the DeltaNet layers' projections are read as matrices
    are; the KV of the 6 attention layers grows with the context, and each sequence's state is read and written."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES["qwen3.5-0.8b"])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 752_393_024
    cfg = config_from_hf(config.to_dict())
    assert cfg.architecture == "qwen3_5" and len(cfg.kv_layers) == 6 and cfg.tie_word_embeddings
    assert weight_bytes(cfg, 2) == 2 * sum(p.numel() for p in model.parameters() if p.dim() == 2)
    state = cfg.linear_attention.state_bytes(2)
    assert state == 18 * (6144 * 3 * 2 + 16 * 128 * 128 * 4)  # the conv rows in bf16, the matrices in float32
    assert floor_ms(cfg, 1e9, 4, 10) - floor_ms(cfg, 1e9, 1, 0) == pytest.approx(
        (weight_bytes(cfg, 2, 4) - weight_bytes(cfg, 2) + 4 * (10 * cfg.kv_bytes_per_token(2) + 2 * state)
         - 2 * state) / 1e6)


def test_the_gpt_oss_shape_is_gpt_oss_20b_with_two_of_its_layers_and_the_floor_reads_the_picked_experts() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES["gpt-oss-20b-2l"])
    model_type = spec.pop("model_type")
    whole = dict(spec, num_hidden_layers=24, layer_types=["sliding_attention", "full_attention"] * 12)
    with torch.device("meta"):
        published = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **whole))
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **spec))
    assert sum(p.numel() for p in published.parameters()) == 20_914_757_184  # openai/gpt-oss-20b
    cfg = config_from_hf(model.config.to_dict())
    assert cfg.architecture == "gpt_oss" and cfg.layer_windows == (128, None) and cfg.attention_sinks
    read = sum(p.numel() for name, p in model.named_parameters()  # what a step multiplies (not biases, sinks,
               if not name.endswith(("bias", "sinks", "norm.weight", "embed_tokens.weight")))  # norms, the table)
    assert weight_bytes(cfg, 2, batch=10**6) == 2 * read  # every expert picked
    expert = 3 * cfg.hidden_size * cfg.moe.intermediate_size
    assert weight_bytes(cfg, 2) == 2 * (read - cfg.num_layers * (32 - 4) * expert)  # batch 1: its 4 of 32
    assert floor_ms(cfg, 1e9, 32, 0) > floor_ms(cfg, 1e9, 1, 0)  # a batch picks more of them


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba", "mamba2"])
def test_a_pure_state_space_models_floor_reads_its_mixers_and_its_states(model_type: str) -> None:
    """No MLP and no KV: a decode step reads every projection of its mixers (not the per-channel decays ``A_log`` of
    Mamba-1, which the scan reads as a state-sized vector) and each sequence's states, in and out."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3, "tie_word_embeddings": True}
    if model_type == "mamba2":
        shape |= {"num_heads": 8, "head_dim": 16, "n_groups": 2}
    config = AutoConfig.for_model(model_type, **shape)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    cfg = config_from_hf(config.to_dict())
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and not name.endswith("A_log"))
    assert weight_bytes(cfg, 2) == 2 * matrices
    state = 2 * cfg.recurrent.state_bytes(2)
    assert floor_ms(cfg, 1e9, 4, 500) - floor_ms(cfg, 1e9, 1, 0) == pytest.approx(3 * state / 1e6)
