"""Tiny random-weight transformers models written as GGUF files the way llama.cpp's converter writes them
(its tensor names from ``gguf.get_tensor_name_map``, its metadata keys, q/k rows permuted for ``llama`` only,
experts stacked into one 3-D tensor per projection, Llama 3.1+'s ``rope_freqs``, Gemma 2's and 3's norms stored as
``1 + weight``), and their HF twins whose
weights are the file's dequantised values, so a float32 forward of both must agree."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch

from kernels.attention.chunked import ChunkedAttention
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import create_backend
from kernels.attention.sparse_index import SparseIndexAttention

F32, F16, Q8_0, Q4_0, Q4_1 = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                              gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
                              gguf.GGMLQuantizationType.Q4_1)
SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, rms_norm_eps=1e-6)
GGUF_ARCH = {"cohere": "command-r", "cohere2": "cohere2", "exaone4": "exaone4", "hunyuan_v1_dense": "hunyuan-dense",
             "hunyuan_v1_moe": "hunyuan-moe", "starcoder2": "starcoder2", "nemotron": "nemotron",
             "phi": "phi2",
             "exaone": "exaone", "dots1": "dots1", "arcee": "arcee",
             "llama": "llama", "granite": "granite", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "gemma": "gemma", "gemma2": "gemma2",
             "gemma3_text": "gemma3",
             "granitemoe": "granitemoe", "granitemoeshared": "granitemoe", "smollm3": "smollm3",
             "seed_oss": "seed_oss", "olmo2": "olmo2", "olmo3": "olmo2", "olmoe": "olmoe", "ernie4_5": "ernie4_5",
             "ernie4_5_moe": "ernie4_5-moe", "minimax_m2": "minimax-m2"}
GRANITES = ("granite", "granitemoe", "granitemoeshared")
# llama.cpp's llama converter and its subclasses permute q/k rows
PERMUTED = ("llama", "granite", "granitemoe", "smollm3", "arcee")
QuantChoice = Callable[[str], gguf.GGMLQuantizationType]  # GGUF tensor name → its type in the file


def all_f32(name: str) -> gguf.GGMLQuantizationType:
    return F32


def mixed(name: str) -> gguf.GGMLQuantizationType:
    """Norms, biases, the router and the shared expert's gate in F32; attention Q8_0, MLP and experts
    Q4_1/Q4_0, the head F16."""
    if name.endswith(("norm.weight", ".bias", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "rope_freqs.weight")):
        return F32
    if name == "output.weight":
        return F16
    if "_exps" in name or name.endswith("ffn_down.weight"):
        return Q4_0
    if "ffn_" in name:
        return Q4_1
    return Q8_0


def tiny_hf(model_type: str, seed: int = 0, **overrides):
    """A float32 model from ``from_config`` with a fixed seed; norms and biases randomised too, so that a
    misplaced one shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**SHAPE, "bos_token_id": 1, "eos_token_id": 2, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomise_norms_and_biases(model)
    return model


def randomise_norms_and_biases(model) -> None:
    """Norms drawn around 1 and biases around 0 (transformers starts them at 1 and 0), so that a misplaced one shows
    in the logits."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.2 * torch.randn_like(param))


def read_as_the_twin(path: Path, model, ids: list[int], expected=None, file_own: tuple[str, ...] = ()):
    """The config the GGUF file at ``path`` (``model`` as a converter wrote it) loads with, once checked: it is
    ``expected`` (default: what ``model``'s ``config.json`` gives) but for what the file says itself (its name, EOS
    ids and float32 epsilon, and the fields ``file_own`` names); the gateway's torch-free reading gives it too; and
    the decoder's float32 logits of ``ids`` equal ``model``'s."""
    from services.engine.model.registry import config_from_hf, model_class
    from services.engine.weights import load_weights
    from services.engine.weights.gguf_metadata import read_gguf_config

    weights = load_weights(path)
    cfg = weights.config
    expected = config_from_hf(model.config.to_dict()) if expected is None else expected
    own = ("name", "eos_token_ids", "rms_norm_eps", *file_own)
    assert cfg == dataclasses.replace(expected, **{field: getattr(cfg, field) for field in own})
    ours = pdserve_logits(model_class(cfg.architecture)(cfg, weights.tensors, torch.float32), ids)
    theirs = hf_logits(model, ids)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
    assert read_gguf_config(path) == cfg  # the gateway's torch-free reading
    return cfg


def llama_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: per head, rows (2, pair) become (pair, 2)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def llama3_rope_freqs(config) -> np.ndarray:
    """llama.cpp's converter's ``rope_freqs`` for a Llama 3.1+ config (its ``generate_extra_tensors``)."""
    s = config.rope_parameters
    dim = config.head_dim
    freqs = 1.0 / (s["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low, high = s["original_max_position_embeddings"] / s["low_freq_factor"], \
        s["original_max_position_embeddings"] / s["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high:
            factors.append(1)
        elif wavelen > low:
            factors.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / \
                (s["high_freq_factor"] - s["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


def _gguf_side(name: str) -> str:
    """A state-dict name as the converter sees it: Granite MoE's experts under Qwen-MoE's names, its router as
    its checkpoints name it (what ``gguf``'s name map knows)."""
    name = name.replace(".block_sparse_moe.experts.", ".mlp.experts.")
    return name.replace(".block_sparse_moe.router.weight", ".block_sparse_moe.router.layer.weight")


def _shared_mlp_halves(name: str) -> tuple[str, str]:
    """Granite MoE's fused shared ``input_linear`` split as llama.cpp's converter splits it (gate rows, up rows)."""
    base = name.replace("shared_mlp.input_linear.weight", "mlp.shared_expert.")
    return base + "gate_proj.weight", base + "up_proj.weight"


def _hf_tensors(model) -> dict[str, np.ndarray]:
    """The state dict with transformers 5's fused experts split back into per-projection stacks (and Granite
    MoE's fused shared MLP into its gate and up)."""
    out = {}
    for state_name, tensor in model.state_dict().items():
        array = tensor.detach().numpy().copy()
        name = _gguf_side(state_name)
        if name.endswith("shared_mlp.input_linear.weight"):
            for half_name, half in zip(_shared_mlp_halves(name), np.split(array, 2, axis=0), strict=True):
                out[half_name] = half
        elif name.endswith("mlp.experts.gate_up_proj"):
            gate, up = np.split(array, 2, axis=1)
            out[name.replace("gate_up_proj", "gate_proj.weight")] = gate
            out[name.replace("gate_up_proj", "up_proj.weight")] = up
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = array
        elif not name.endswith("rotary_emb.inv_freq"):
            out[name] = array
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def _roundtrip(array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray]:
    """(what the file stores, its float32 dequantisation)."""
    stored = gguf.quants.quantize(array.astype(np.float32), qtype)
    return stored, np.asarray(gguf.quants.dequantize(stored, qtype), dtype=np.float32).reshape(array.shape)


def write_gguf(model, path: Path, quant: QuantChoice = all_f32, metadata: dict | None = None,
               extra: dict[str, np.ndarray] | None = None, vocab_size: bool = True,
               tokens: list[str] | None = None, one_tensor_per_expert: bool = False, fused_qkv: bool = False) -> Path:
    """Write ``model`` as llama.cpp would, and load the file's dequantised values into ``model`` (its twin).

    ``metadata`` adds or overrides ``{arch}.*`` keys (``None`` values drop one); ``extra`` adds raw tensors
    under GGUF names (written as they are); ``vocab_size=False`` leaves ``{arch}.vocab_size`` out; ``tokens``:
    the token list (default ``<t0>``, ``<t1>``, …); ``one_tensor_per_expert``: experts as early-2024 Mixtral
    files store them (``blk.N.ffn_gate.E.weight``, not one 3-D ``ffn_gate_exps``); ``fused_qkv``: q, k and v rows
    stacked in one ``attn_qkv`` (and its bias), as older Phi-2 files hold them.
    """
    cfg = model.config
    arch = GGUF_ARCH[cfg.model_type]
    model_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)  # GRANITE_MOE: "granitemoe"
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    keys = {
        "block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
        "rope.freq_base": float(cfg.rope_parameters.get("full_attention", cfg.rope_parameters)["rope_theta"]),
        "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        "attention.key_length": head_dim, "attention.value_length": head_dim, "rope.dimension_count": head_dim,
    }
    if vocab_size:
        keys["vocab_size"] = cfg.vocab_size
    if cfg.model_type == "qwen3_moe":
        keys.update({"expert_count": cfg.num_experts, "expert_used_count": cfg.num_experts_per_tok,
                     "expert_feed_forward_length": cfg.moe_intermediate_size})
    if cfg.model_type == "qwen2_moe":
        keys.update({"expert_count": cfg.num_experts, "expert_used_count": cfg.num_experts_per_tok,
                     "expert_feed_forward_length": cfg.moe_intermediate_size,
                     "expert_shared_feed_forward_length": cfg.shared_expert_intermediate_size})
    if cfg.model_type == "mixtral":  # llama.cpp's llama with experts: they are feed_forward_length wide
        keys.update({"expert_count": cfg.num_local_experts, "expert_used_count": cfg.num_experts_per_tok})
    if cfg.model_type == "gemma3_text":  # llama.cpp reads the pattern (6), local base (1e4) and scale as its own
        keys["attention.sliding_window"] = cfg.sliding_window
        full = cfg.rope_parameters["full_attention"]
        if full.get("rope_type") == "linear":  # the 4B+ models' scaling, as its converter writes it
            keys.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(full["factor"])})
    if cfg.model_type in ("granitemoe", "granitemoeshared"):  # each expert feed_forward_length wide
        keys.update({"expert_count": cfg.num_local_experts, "expert_used_count": cfg.num_experts_per_tok})
        if getattr(cfg, "shared_intermediate_size", 0):
            keys["expert_shared_feed_forward_length"] = cfg.shared_intermediate_size
    if cfg.model_type in GRANITES:  # its converter renames the multipliers to *_scale
        keys.update({"embedding_scale": float(cfg.embedding_multiplier),
                     "residual_scale": float(cfg.residual_multiplier),
                     "attention.scale": float(cfg.attention_multiplier), "logit_scale": float(cfg.logits_scaling)})
    if cfg.model_type == "gemma2":  # llama.cpp reads the pattern (2) and the scale as its own
        keys.update({"attention.sliding_window": cfg.sliding_window,
                     "attn_logit_softcapping": float(cfg.attn_logit_softcapping),
                     "final_logit_softcapping": float(cfg.final_logit_softcapping)})
    keys.update(metadata or {})
    writer.add_name(f"tiny-{arch}")
    add_metadata(writer, arch, keys, tokens or [f"<t{i}>" for i in range(cfg.vocab_size)])

    twin, fused = {}, {}
    for hf_name, array in _hf_tensors(model).items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias")) or _correction_bias_name(hf_name)
        assert name is not None, hf_name
        if name.endswith("ffn_gate_inp_shexp.weight"):  # llama.cpp's converter squeezes it to [hidden]
            array = array.reshape(-1)
        qtype = quant(name)
        offset = 1.0 if arch in ("gemma", "gemma2", "gemma3", "nemotron") and name.endswith("norm.weight") else 0.0
        stored, twin[hf_name] = _roundtrip(array + np.float32(offset), qtype)
        twin[hf_name] = twin[hf_name] - np.float32(offset)  # not in place: an F32 twin is the stored array
        if arch in PERMUTED and (".q_proj." in hf_name or ".k_proj." in hf_name):
            # rows are quantised independently: permuting the stored rows permutes the weight's rows
            heads = cfg.num_attention_heads if ".q_proj." in hf_name else cfg.num_key_value_heads
            stored = llama_permute(stored, heads)
        raw_dtype = qtype if qtype not in (F32, F16) else None
        if fused_qkv and (part := re.match(r"(blk\.\d+\.)attn_([qkv])\.(weight|bias)$", name)):
            # rows are quantised independently: the stacked rows are what quantising the fused weight stores
            fused.setdefault(part.group(1) + "attn_qkv." + part.group(3), {})[part.group(2)] = (stored, raw_dtype)
            continue
        if one_tensor_per_expert and "_exps." in name:
            for expert, rows in enumerate(stored):  # rows are quantised independently: a slice is one expert's
                writer.add_tensor(name.replace("_exps.", f".{expert}."), rows, raw_dtype=raw_dtype)
            continue
        writer.add_tensor(name, stored, raw_dtype=raw_dtype)
    for name, parts in fused.items():
        writer.add_tensor(name, np.concatenate([parts[kind][0] for kind in "qkv"]), raw_dtype=parts["q"][1])
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    close_writer(writer)
    _load_twin(model, twin)
    return path


def _correction_bias_name(hf_name: str) -> str | None:
    """A router's correction bias as llama.cpp's converter names it (``e_score_correction_bias`` renamed
    ``e_score_correction.bias``: ``exp_probs_b.bias``), wherever the checkpoint keeps it (MiniMax-M2's block, ERNIE
    4.5's ``moe_statics``)."""
    if not hf_name.endswith("e_score_correction_bias"):
        return None
    return f"blk.{hf_name.split('.')[2]}.exp_probs_b.bias"


def add_metadata(writer: gguf.GGUFWriter, arch: str, keys: dict, tokens: list[str]) -> None:
    """``{arch}.*`` keys as llama.cpp's converter types them (strings, float32, lists as arrays, other numbers
    uint32; ``None`` skipped), then BOS 1, EOS 2 and the token list."""
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        elif isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", int(value))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_token_list(tokens)


def tensor_adder(writer: gguf.GGUFWriter, names, quant: QuantChoice) -> Callable[[str, np.ndarray], np.ndarray]:
    """``add(hf_name, array)``: writes ``array`` under the GGUF name ``names`` gives ``hf_name`` (its ``.weight`` or
    ``.bias`` suffix tried), quantised as ``quant`` chooses, and returns the file's float32 dequantisation of it."""
    def add(hf_name: str, array: np.ndarray) -> np.ndarray:
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        return add_tensor_as(writer, name, array, quant)

    return add


def add_tensor_as(writer: gguf.GGUFWriter, name: str, array: np.ndarray, quant: QuantChoice) -> np.ndarray:
    """``array`` written under the GGUF name ``name``, quantised as ``quant`` chooses; the file's float32
    dequantisation of it."""
    qtype = quant(name)
    stored = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
    writer.add_tensor(name, stored, raw_dtype=None if qtype == F32 else qtype)
    return np.asarray(gguf.quants.dequantize(stored, qtype), dtype=np.float32).reshape(array.shape)


def write_bpe_tokenizer_gguf(path: Path, arch: str, keys: dict, pre: str, tokenizer_hf,
                             add_bos: bool | None = None) -> Path:
    """A GGUF file of ``arch`` (its ``keys``) holding ``tokenizer_hf``'s byte-level BPE as llama.cpp's GPT-2-style
    vocab writes it (the tokens, the merges, ``tokenizer.ggml.pre`` ``pre``, ``add_bos_token`` where given) and an
    8-wide embedding."""
    import json

    backend = json.loads(tokenizer_hf.backend_tokenizer.to_str())
    tokens = [""] * len(backend["model"]["vocab"])
    for text, i in backend["model"]["vocab"].items():
        tokens[i] = text
    writer = gguf.GGUFWriter(str(path), arch)
    add_metadata(writer, arch, keys, tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]])
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    close_writer(writer)
    return path


def write_spm_tokenizer_gguf(path: Path, arch: str, keys: dict, pieces: list[str], add_space_prefix: bool) -> Path:
    """A GGUF file of ``arch`` (its ``keys``) holding a sentencepiece vocabulary as llama.cpp's converter writes one
    (``tokenizer.ggml.model`` ``llama``, pre ``default``, scores that rank ``pieces`` in order, ``<unk>``, ``<s>``,
    ``</s>`` first, ``add_space_prefix``) and an 8-wide embedding."""
    tokens = ["<unk>", "<s>", "</s>", *pieces]
    writer = gguf.GGUFWriter(str(path), arch)
    add_metadata(writer, arch, keys, tokens)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_scores([0.0, 0.0, 0.0, *(-float(i) for i in range(len(pieces)))])
    writer.add_token_types([2, 3, 3, *([1] * len(pieces))])
    writer.add_add_space_prefix(add_space_prefix)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    close_writer(writer)
    return path


def close_writer(writer: gguf.GGUFWriter) -> None:
    """Writes the header, the metadata and the tensors, and closes the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _load_twin(model, twin: dict[str, np.ndarray]) -> None:
    state = model.state_dict()
    for name in list(state):
        key = _gguf_side(name)
        if key.endswith("shared_mlp.input_linear.weight"):
            state[name] = torch.from_numpy(np.concatenate([twin[half] for half in _shared_mlp_halves(key)]))
        elif key.endswith("mlp.experts.gate_up_proj"):
            gate, up = twin[key.replace("gate_up_proj", "gate_proj.weight")], \
                twin[key.replace("gate_up_proj", "up_proj.weight")]
            state[name] = torch.from_numpy(np.concatenate([gate, up], axis=1))
        elif key.endswith("mlp.experts.down_proj"):
            state[name] = torch.from_numpy(twin[key + ".weight"])
        elif key in twin:
            state[name] = torch.from_numpy(twin[key]).reshape(state[name].shape)  # a squeezed one, as stored
    if model.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)


def pdserve_logits(model, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Float32 logits of every position of one full-prompt forward of a ``DecoderModel`` (a hybrid one with a
    fresh recurrent state, its attention layers' KV only)."""
    from services.engine.recurrent_states import RecurrentStates

    cfg = model.config
    blocks = -(-len(ids) // block_size)
    kv = torch.zeros(len(cfg.kv_layers), blocks, 2, block_size, cfg.num_kv_heads, cfg.head_dim, dtype=model.dtype)
    attention = create_backend("torch", "cpu")
    if cfg.attention_chunk is not None:  # chunked layers (Llama 4's) take a second plan
        attention = ChunkedAttention(attention, create_backend("torch", "cpu"), cfg.attention_chunk)
    if cfg.mla is not None and cfg.mla.index is not None:  # DeepSeek-V3.2's indexed layers
        attention = SparseIndexAttention(attention)
    attention.plan(AttentionMetadata.build([len(ids)], [len(ids)], [list(range(blocks))], block_size, "cpu"))
    states = None
    if cfg.recurrent is not None:
        states = RecurrentStates(cfg.recurrent, 1, model.dtype, torch.device("cpu"))
        states.set_plan([0], [len(ids)], [True])
    with torch.inference_mode():
        return model.forward(torch.tensor(ids), torch.arange(len(ids)), list(kv.unbind(0)), attention,
                             torch.arange(len(ids)), states=states)


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def assert_checkpoint_logits(path: Path, ids: list[int]):
    """The checkpoint at ``path`` (a tiny family's, tests/engine/tiny_families.py) gives transformers' float32 logits
    of ``ids`` in its pdserve model; its loaded weights."""
    from services.engine.model.registry import model_class
    from services.engine.weights import load_weights
    from tests.engine.tiny_families import load_reference

    weights = load_weights(path)
    ours = pdserve_logits(model_class(weights.config.architecture)(weights.config, weights.tensors, torch.float32), ids)
    expected = hf_logits(load_reference(path), ids)
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), (ours - expected).abs().max()
    return weights


def exactness_probe(path, prompt: list[int]):
    """For a tiny family checkpoint at ``path``: its weights, transformers' logits of ``prompt``, and
    ``logits(config=, tensors=)``, pdserve's logits of it (its family's model) with the config or tensors changed
    (float32)."""
    from services.engine.model.registry import model_class
    from services.engine.weights import load_weights
    from tests.engine.tiny_families import load_reference

    weights = load_weights(path)
    expected = hf_logits(load_reference(path), prompt)
    model = model_class(weights.config.architecture)

    def logits(config=weights.config, tensors=weights.tensors) -> torch.Tensor:
        return pdserve_logits(model(config, dict(tensors), torch.float32), prompt)

    return weights, expected, logits


def assert_each_part_matters(logits, expected: torch.Tensor, unmade: dict[str, dict]) -> None:
    """``logits()`` (an :func:`exactness_probe`'s) are ``expected``, and each change of ``unmade`` (a part's name →
    the ``config=`` or ``tensors=`` without it) moves them: each part is what makes them transformers'."""
    assert torch.allclose(logits(), expected, atol=1e-5, rtol=0), (logits() - expected).abs().max()
    for part, change in unmade.items():
        assert not torch.allclose(logits(**change), expected, atol=1e-3, rtol=0), part
