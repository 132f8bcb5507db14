"""FP8 checkpoints: block-scaled (DeepSeek-V3's, Qwen3-FP8's, MiniMax-M2's format: a float32 scale per 16x16 block
here) and per-tensor with static activation scales (Ministral 3's and Devstral 2's). A tiny family's linear weights
written as float8 e4m3 load as the bf16 weights transformers' own FP8 loader dequantises
(``FineGrainedFP8Config(dequantize=True)``), bit for bit, and the engine serves transformers' greedy tokens from
them; a block cut by the matrix's edge takes its block's scale; E8M0 scales; what is not served is refused by
name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.model.registry import tensor_renamer
from services.engine.sampling_params import SamplingParams
from services.engine.weights import load_weights
from services.engine.weights.fp8_blocks import Fp8Scheme, dequantize_fp8, dequantize_weight, fp8_scheme
from tests.engine.test_model_families import NEW_TOKENS, _prompts, assert_matches
from tests.engine.tiny_families import greedy_full_forward

BLOCK = 16
_PROJECTIONS = ("proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")  # Mixtral's and MiniMax's expert names
QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
PER_TENSOR = {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": None, "dequantize": False}
PER_TENSOR_FAMILIES = {"mistral3-text"}


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 codes and float32 block scales of a ``[rows, cols]`` weight (both multiples of the block)."""
    rows, cols = weight.shape
    blocks = weight.float().view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0
    return (blocks / scale[:, None, :, None]).view(rows, cols).to(torch.float8_e4m3fn), scale


def _quantize_per_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 codes and the one float32 scale (a 0-d tensor) of a weight."""
    scale = weight.float().abs().amax() / 448.0
    return (weight.float() / scale).to(torch.float8_e4m3fn), scale


def _fp8_copy(source, target, per_tensor: bool = False):
    """``target``: ``source``'s checkpoint with every projection of its layers in FP8 blocks, or per tensor with a
    static activation scale each (as the released FP8 files: embeddings, norms, routers and the head stay as they
    were)."""
    tensors = unsharded_copy(source, target)
    stored = {}
    for name, tensor in tensors.items():
        if name.startswith("model.layers.") and name.endswith(_PROJECTIONS) and tensor.dim() == 2 and per_tensor:
            stored[name], stored[name + "_scale_inv"] = _quantize_per_tensor(tensor)
            stored[name.removesuffix(".weight") + ".activation_scale"] = torch.tensor(0.05)
        elif name.startswith("model.layers.") and name.endswith(_PROJECTIONS) and tensor.dim() == 2:
            stored[name], stored[name + "_scale_inv"] = _quantize(tensor)
        else:
            stored[name] = tensor
    save_file(stored, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    quantization = PER_TENSOR if per_tensor else QUANTIZATION
    (target / "config.json").write_text(json.dumps(config | {"quantization_config": quantization}))
    return target


def unsharded_copy(source, target) -> dict[str, torch.Tensor]:
    """``source``'s checkpoint copied to ``target`` without its weights (shards and index), and those weights: a
    test writes them back transformed, as one file."""
    shutil.copytree(source, target)
    tensors = {}
    for file in sorted(target.glob("*.safetensors")):
        tensors |= load_file(str(file))
        file.unlink()
    (target / "model.safetensors.index.json").unlink(missing_ok=True)
    return tensors


@pytest.fixture(scope="module", params=["qwen3", "deepseek-v3", "minimax_m2", "mistral3-text"])
def fp8(request, family_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    path = _fp8_copy(family_dir(request.param), tmp_path_factory.mktemp("fp8") / request.param,
                     per_tensor=request.param in PER_TENSOR_FAMILIES)
    reference = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16,
                                                     quantization_config=FineGrainedFP8Config(dequantize=True))
    return request.param, path, reference.eval()


def test_the_weights_are_transformers_dequantised_ones_bit_for_bit(fp8):
    name, path, reference = fp8
    loaded = load_weights(path)
    quantized = [n for n in load_file(str(path / "model.safetensors")) if n.endswith("_scale_inv")]
    assert quantized and not any(n.endswith(("_scale_inv", "activation_scale")) for n in loaded.tensors)
    hf, rename = reference.state_dict(), tensor_renamer(loaded.config)
    for scale_name in quantized:
        weight = rename(scale_name.removesuffix("_scale_inv"))  # the shared decoder's name
        ours = loaded.tensors[weight]
        assert ours.dtype == torch.bfloat16 and torch.equal(ours, transformers_weight(hf, weight, ours)), (name, weight)


def transformers_weight(hf: dict[str, torch.Tensor], weight: str, ours: torch.Tensor) -> torch.Tensor:
    """The tensor of transformers' ``state_dict`` that is the shared decoder's ``weight`` (``ours``, its rows): a
    shared expert's under its own name, a routed expert's cut from transformers 5's stacked experts (gate and up rows
    together)."""
    if weight.replace(".shared_expert.", ".shared_experts.") in hf:
        return hf[weight.replace(".shared_expert.", ".shared_experts.")]
    layer, rest = weight.split(".mlp.experts.")
    expert, projection = rest.split(".")[:2]
    stacked = hf[f"{layer}.mlp.experts.{'down_proj' if projection == 'down_proj' else 'gate_up_proj'}"]
    theirs, rows = stacked[int(expert)], ours.shape[0]
    return {"gate_proj": theirs[:rows], "up_proj": theirs[rows:]}.get(projection, theirs)


def test_the_engine_serves_transformers_tokens_from_the_fp8_weights(fp8):
    assert_engine_serves_reference(*fp8)


def assert_engine_serves_reference(name: str, path, reference) -> None:
    """The engine serves the checkpoint at ``path`` with the greedy tokens of transformers' dequantised load
    (``reference``, bf16), computed in float32 as the engine computes it here."""
    reference = reference.float()
    engine = LLMEngine.from_config(EngineConfig(model_path=str(path), dtype="float32", num_kv_blocks=64,
                                                max_num_batched_tokens=64))
    prompts = _prompts()
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for label in ("short", "long"):
        result = engine.generate([prompts[label]], sampling)[0]
        assert_matches(f"{name}/{label}", greedy_full_forward(reference, prompts[label], NEW_TOKENS), result.token_ids)


def test_a_block_cut_by_the_edge_takes_its_block_s_scale_and_e8m0_scales_are_powers_of_two():
    gen = torch.Generator().manual_seed(2)
    weight = (torch.randn(20, 40, generator=gen) * 8).to(torch.float8_e4m3fn)  # blocks of 16: 2 x 3, cut at both
    scale = torch.rand(2, 3, generator=gen) + 0.5
    got = dequantize_weight("w", weight, scale, (16, 16))
    expected = torch.empty(20, 40)
    for r in range(20):
        for c in range(40):
            expected[r, c] = weight[r, c].float() * scale[r // 16, c // 16]
    assert torch.equal(got, expected.bfloat16())
    exponents = torch.tensor([[120, 127, 130]], dtype=torch.uint8)  # E8M0: 2 ** (byte - 127)
    got = dequantize_weight("w", weight[:16], exponents, (16, 16))
    assert torch.equal(got, (weight[:16].float() * torch.tensor([2.0**-7, 1.0, 8.0]).repeat_interleave(16)[:40]
                             ).bfloat16())


@pytest.mark.parametrize(("quantization", "named"), [
    (QUANTIZATION | {"activation_scheme": "per-channel"}, "activation_scheme 'per-channel'"),
    (QUANTIZATION | {"fmt": "e5m2"}, "fmt 'e5m2'"),
    (QUANTIZATION | {"weight_block_size": [128]}, r"weight_block_size of \[128\]"),
    ({"quant_method": "gptq", "bits": 4}, "quantization 'gptq' is not supported"),
    ({"quant_method": "awq", "bits": 4}, "quantization 'awq' is not supported"),
])
def test_an_fp8_checkpoint_that_cannot_be_served_exactly_is_refused_by_name(quantization, named):
    with pytest.raises(ModelLoadError, match=named):
        fp8_scheme({"quantization_config": quantization})
    assert fp8_scheme({"quantization_config": {"quant_method": "mxfp4"}}) is None  # GPT-OSS reads its own
    # MiniMax-M2's own spelling of the format, with the modules it leaves unquantized
    minimax = {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
               "weight_block_size": [128, 128],
               "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}
    assert fp8_scheme({"quantization_config": minimax}) == Fp8Scheme((128, 128))
    assert fp8_scheme({}) is None
    # Devstral 2's: one scale per tensor, static activation scales
    devstral = {"activation_scheme": "static", "dequantize": False, "quant_method": "fp8", "weight_block_size": None,
                "modules_to_not_convert": ["model.vision_tower", "model.multi_modal_projector", "lm_head"]}
    assert fp8_scheme({"quantization_config": devstral}) == Fp8Scheme(None)


@pytest.mark.parametrize(("tensors", "named"), [
    ({"a.weight": torch.zeros(16, 16, dtype=torch.float8_e4m3fn)}, "'a.weight' is FP8 without its '_scale_inv'"),
    ({"a.weight_scale_inv": torch.ones(1, 1)}, "scale 'a.weight_scale_inv' has no weight"),
    ({"a.weight": torch.zeros(32, 16, dtype=torch.float8_e4m3fn), "a.weight_scale_inv": torch.ones(1, 1)},
     r"needs \(2, 1\)"),
    ({"a.weight": torch.zeros(16, 16), "a.weight_scale_inv": torch.ones(1, 1)}, "not a float8_e4m3fn matrix"),
    ({"a.weight": torch.zeros(16, dtype=torch.float8_e4m3fn), "a.weight_scale_inv": torch.ones(1)},
     "1-d torch.float8_e4m3fn tensor"),
])
def test_a_weight_and_scale_that_do_not_pair_are_refused_by_name(tensors, named):
    with pytest.raises(ModelLoadError, match=named):
        dequantize_fp8(dict(tensors), Fp8Scheme((16, 16)))


def test_per_tensor_scales_multiply_the_whole_weight_and_a_wider_scale_is_refused_by_name():
    weight = (torch.randn(8, 12, generator=torch.Generator().manual_seed(3)) * 8).to(torch.float8_e4m3fn)
    tensors = {"a.weight": weight, "a.weight_scale_inv": torch.tensor([0.25]), "a.activation_scale": torch.tensor(2.0)}
    dequantize_fp8(tensors, Fp8Scheme(None))
    assert list(tensors) == ["a.weight"] and torch.equal(tensors["a.weight"], (weight.float() * 0.25).bfloat16())
    with pytest.raises(ModelLoadError, match=r"'a.weight' is \(8,\); a checkpoint without weight_block_size has one"):
        dequantize_fp8({"a.weight": weight, "a.weight_scale_inv": torch.ones(8)}, Fp8Scheme(None))
