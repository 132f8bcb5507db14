"""compressed-tensors checkpoints (llm-compressor's): a tiny family's linear weights compressed by the library itself —
Kimi K2.5's scheme (its routed experts INT4 in symmetric groups, the config in the text model's, the released
names), an asymmetric W4A16 (packed zero points), a W8A16 Mixtral (its expert names) and an FP8-dynamic one (float8
weights per channel with float32 scales, activations quantized per token) — load as the weights transformers'
``CompressedTensorsConfig(dequantize=True)`` holds, bit for bit, and the engine serves transformers' greedy tokens
from them; what cannot be served is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.model.registry import tensor_renamer
from services.engine.sampling_params import SamplingParams
from services.engine.weights import load_weights
from services.engine.weights.compressed_checkpoint import CompressedScheme, compressed_scheme, decompress_weights
from services.engine.weights.fp8_blocks import fp8_scheme
from tests.engine.test_fp8_checkpoints import assert_engine_serves_reference, transformers_weight, unsharded_copy
from tests.engine.test_model_families import assert_matches
from tests.engine.tiny_families import greedy_full_forward

_PROJECTIONS = ("proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")  # (Mixtral's expert names)


def _weights(**args) -> dict:
    return {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "observer": "minmax",
            "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int", "num_bits": 4} | args


def _config(weights: dict, fmt: str, ignore: list[str], activations: dict | None = None) -> dict:
    return {"config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": activations,
                                          "output_activations": None}},
            "format": fmt, "ignore": ignore, "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed"}


# name -> (family, its quantization_config, which projections it quantizes, written in the text model's config, the
# scales' dtype)
KIMI = _config(_weights(group_size=16), "pack-quantized",  # Kimi's groups are 32 wide; the tiny experts' 48 need 16
               ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|down)_proj.*"])
CASES = {
    "kimi-k2.5-int4": ("deepseek-kimi_k25", KIMI, ".mlp.experts.", True, torch.bfloat16),
    "w4a16-asymmetric": ("qwen3", _config(_weights(group_size=16, symmetric=False), "pack-quantized", ["lm_head"]),
                         "model.layers.", False, torch.bfloat16),
    # Mixtral's expert names (w1/w2/w3) map only as ``.weight``s: their packed tensors go where those go
    "w8a16-mixtral": ("mixtral", _config(_weights(num_bits=8, strategy="channel"), "pack-quantized", ["lm_head"]),
                      "model.layers.", False, torch.bfloat16),
    "fp8-dynamic": ("llama3", _config(_weights(type="float", num_bits=8, strategy="channel"), "float-quantized",
                                      ["lm_head"], activations=_weights(type="float", num_bits=8, strategy="token",
                                                                        dynamic=True)), "model.layers.", False,
                    torch.float32),  # float32 scales: the weights come out bf16 all the same
}


def _compress(weight: torch.Tensor, compressed: CompressedScheme, scale_dtype: torch.dtype = torch.bfloat16
              ) -> dict[str, torch.Tensor]:
    """The library's own compressed tensors of ``weight``: min-max scales (in ``scale_dtype``) per the scheme's
    strategy, then its compressor's ``compress``."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    args = compressed.scheme.weights
    rows, cols = weight.shape
    blocks = weight.view(rows, cols // args.group_size, args.group_size) if args.strategy == "group" \
        else weight.view(rows, 1, cols)
    scale, zero_point = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args)
    state = {"weight": weight, "weight_scale": scale.to(scale_dtype), "weight_zero_point": zero_point}
    return BaseCompressor.get_value_from_registry(compressed.format).compress(state, compressed.scheme)


def _compressed_copy(source, target, quantization: dict, selected: str, in_text_config: bool,
                     scale_dtype: torch.dtype = torch.bfloat16):
    """``target``: ``source``'s checkpoint in bf16, the projections whose names hold ``selected`` compressed."""
    tensors = unsharded_copy(source, target)
    config = json.loads((target / "config.json").read_text())
    compressed = compressed_scheme({"quantization_config": quantization})
    stored = {}
    for name, tensor in tensors.items():
        tensor = tensor.to(torch.bfloat16)
        if selected in name and name.endswith(_PROJECTIONS) and "shared_experts" not in name and tensor.dim() == 2:
            module = name.removesuffix(".weight")
            stored |= {f"{module}.{param}": value
                       for param, value in _compress(tensor.float(), compressed, scale_dtype).items()}
        else:
            stored[name] = tensor
    save_file(stored, str(target / "model.safetensors"), metadata={"format": "pt"})
    if in_text_config:
        config["text_config"]["quantization_config"] = quantization
    else:
        config["quantization_config"] = quantization
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module", params=sorted(CASES))
def compressed(request, family_dir, tmp_path_factory):
    from transformers import CompressedTensorsConfig

    from tests.engine.tiny_families import auto_class

    family, quantization, selected, in_text, scale_dtype = CASES[request.param]
    root = tmp_path_factory.mktemp("compressed")
    path = _compressed_copy(family_dir(family), root / request.param, quantization, selected, in_text, scale_dtype)
    config = json.loads((path / "config.json").read_text())
    reference_path = path
    if in_text:  # transformers reads the top level's: the same files, the config written there
        reference_path = root / f"{request.param}-top"
        reference_path.mkdir()
        for file in path.iterdir():
            (reference_path / file.name).symlink_to(file)
        (reference_path / "config.json").unlink()
        (reference_path / "config.json").write_text(json.dumps(config | {"quantization_config": quantization}))
    reference = auto_class(config["model_type"]).from_pretrained(
        str(reference_path), dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(dequantize=True))
    return request.param, path, reference.eval()


def test_the_weights_are_transformers_decompressed_ones_bit_for_bit(compressed):
    name, path, reference = compressed
    loaded = load_weights(path)
    stored = load_file(str(path / "model.safetensors"))
    quantized = [n.removesuffix(".weight_scale") + ".weight" for n in stored if n.endswith(".weight_scale")]
    assert quantized and not any(n.endswith(("_packed", "_scale", "_shape", "_zero_point")) for n in loaded.tensors)
    hf = {k.replace("model.language_model.", "model."): v for k, v in reference.state_dict().items()}
    rename = tensor_renamer(loaded.config)
    for weight in map(rename, quantized):
        ours = loaded.tensors[weight]
        assert ours.dtype == torch.bfloat16 and torch.equal(ours, transformers_weight(hf, weight, ours)), (name, weight)
    # what the checkpoint left unquantized (Kimi's attention, shared experts, dense layer) is read as stored
    kept = [n for n in stored if n.endswith("proj.weight") and n not in quantized and rename(n) is not None]
    if name == "kimi-k2.5-int4":
        assert kept and all(".mlp.experts." in n for n in quantized)
    else:
        assert not kept
    for stored_name in kept:
        assert torch.equal(loaded.tensors[rename(stored_name)], stored[stored_name]), stored_name


def test_the_engine_serves_transformers_tokens_from_the_decompressed_weights(compressed):
    assert_engine_serves_reference(*compressed)


def _refused(quantization: dict) -> dict:
    return {"quantization_config": quantization}


@pytest.mark.parametrize(("quantization", "named"), [
    (KIMI | {"format": "nvfp4-pack-quantized"}, "format 'nvfp4-pack-quantized' is not supported"),
    (KIMI | {"format": "mixed-precision"}, "format 'mixed-precision' is not supported"),
    (KIMI | {"kv_cache_scheme": _weights(type="float", num_bits=8, strategy="tensor")}, "kv_cache_scheme"),
    (KIMI | {"config_groups": {**KIMI["config_groups"], "group_1": {"targets": ["re:.*down_proj"],
                                                                    "weights": _weights(num_bits=8, group_size=16)}}},
     "quantize weights differently"),
    (KIMI | {"config_groups": {"group_0": {"targets": ["Linear"], "weights": _weights(group_size=16),
                                           "format": "float-quantized"}}}, "mixed formats"),
    (KIMI | {"config_groups": {"group_0": {"targets": ["Linear"], "weights": _weights(num_bits="four")}}},
     "not one"),
    (KIMI | {"sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}},
     "sparsity_config of format 'sparse-24-bitmask'"),
])
def test_a_compressed_checkpoint_that_cannot_be_served_exactly_is_refused_by_name(quantization, named):
    with pytest.raises(ModelLoadError, match=named):
        compressed_scheme(_refused(quantization))
    assert fp8_scheme(_refused(quantization)) is None  # not an FP8 checkpoint's to refuse
    assert compressed_scheme({}) is None and compressed_scheme(_refused({"quant_method": "fp8"})) is None
    # a wrapper's text model's config holds it (Kimi K2.5's)
    assert compressed_scheme({"text_config": {"quantization_config": KIMI}}).format == "pack-quantized"


def test_a_module_short_of_a_tensor_or_one_left_over_is_refused_by_name():
    scheme = compressed_scheme(_refused(KIMI))
    weight = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
    tensors = {f"a.{k}": v for k, v in _compress(weight, scheme).items()}
    ok = dict(tensors)
    decompress_weights(ok, scheme)
    assert list(ok) == ["a.weight"] and ok["a.weight"].dtype == torch.bfloat16 and ok["a.weight"].shape == (8, 32)
    del tensors["a.weight_shape"]
    with pytest.raises(ModelLoadError, match=r"'a' has no 'weight_shape' beside its 'weight_packed'"):
        decompress_weights(dict(tensors), scheme)
    with pytest.raises(ModelLoadError, match=r"'b\.weight_zero_point' belongs to no quantized weight"):
        decompress_weights({"b.weight_zero_point": torch.ones(1, 1, dtype=torch.int32)}, scheme)
    # another layout (llm-compressor's fused experts), or a scale without its packed weight: named, not mis-read
    with pytest.raises(ModelLoadError, match=r"'e\.gate_up_proj_packed' belongs to no quantized weight"):
        decompress_weights({"e.gate_up_proj_packed": torch.zeros(2, 4, 1, dtype=torch.int32)}, scheme)
    with pytest.raises(ModelLoadError, match=r"'c\.weight_scale' belongs to no quantized weight"):
        decompress_weights({"c.weight_scale": torch.ones(8, 1)}, scheme)
    # checkpoints saved before mid-2024 stored all-zero zero points beside symmetric weights: dropped
    old = dict(ok | {f"a.{k}": v for k, v in _compress(weight, scheme).items()})
    old.pop("a.weight")
    old["a.weight_zero_point"] = torch.zeros(8, 1, dtype=torch.int32)
    decompress_weights(old, scheme)
    assert list(old) == ["a.weight"] and torch.equal(old["a.weight"], ok["a.weight"])


def test_the_bundled_model_compressed_to_w4a16_serves_transformers_tokens(hf_bundled_model, bundled_tokenizer,
                                                                          tmp_path):
    """The real SmolLM2-135M, its layers' projections compressed as a W4A16 release is (int4, symmetric groups of
    64): the engine's greedy tokens are transformers' from the same file."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    source = tmp_path / "smollm2"  # (transformers will not save a model it read from GGUF: written here)
    source.mkdir()
    config = {k: v for k, v in hf_bundled_model.config.to_dict().items() if k != "quantization_config"}
    (source / "config.json").write_text(json.dumps(config))
    tensors = {name: tensor.contiguous() for name, tensor in hf_bundled_model.state_dict().items()
               if name != "lm_head.weight" or not config["tie_word_embeddings"]}
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    bundled_tokenizer.hf.save_pretrained(str(source))
    w4a16 = _config(_weights(group_size=64), "pack-quantized", ["lm_head"])
    path = _compressed_copy(source, tmp_path / "smollm2-w4a16", w4a16, "model.layers.", in_text_config=False)
    reference = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(dequantize=True)).float().eval()
    engine = LLMEngine.from_config(EngineConfig(model_path=str(path), dtype="float32", num_kv_blocks=64,
                                                max_num_batched_tokens=64))
    prompt = bundled_tokenizer.encode("The three primary colours are")
    result = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0.0))[0]
    expected = greedy_full_forward(reference, prompt, 16)
    assert_matches("smollm2-w4a16", expected, result.token_ids)
    assert len(result.token_ids) == 16 and engine.kv.num_free_blocks == engine.kv.num_blocks
