"""Llama models with random weights, for benchmarks and tests where real weights cannot be had (the GPU
machine cannot download any, and the bundled GGUF is too large to carry there).

``PRESETS`` holds architectures: the bundled SmolLM2-135M's own shape, a Llama-3.2-1B-like one and a tiny
one for unit tests. Speed depends only on the architecture and dtype, so a random model of the bundled
model's shape decodes exactly as fast as the bundled model. Weights are drawn with a fixed seed; the
scale (``std``) keeps activations and logits O(1), so greedy choices are not near-ties.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from services.engine.model.config import GemmaConfig, ModelConfig, MoEConfig
from services.engine.model.decoder import DecoderModel
from services.engine.model.registry import model_class


def _config(name: str, vocab: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
            theta: float, tied: bool, max_position: int = 8192) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                       rope_theta=theta, rms_norm_eps=1e-5, max_position=max_position, tie_word_embeddings=tied,
                       bos_token_id=1, eos_token_ids=(2,))


PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": _config("random-smollm2-135m", 49152, 576, 1536, 30, 9, 3, 100000.0, True),
    "llama-1b": _config("random-llama-1b", 128256, 2048, 8192, 16, 32, 8, 500000.0, True),
    "tiny": _config("random-tiny", 512, 128, 256, 2, 4, 2, 10000.0, False, max_position=2048),
    # the real-size shapes of issue 29 (GPU benchmark only: 16 GB of bf16 weights each)
    "llama-3.1-8b": _config("random-llama-3.1-8b", 128256, 4096, 14336, 32, 32, 8, 500000.0, False),
    "qwen3-8b": replace(_config("random-qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 1000000.0, False),
                        architecture="qwen3", qk_norm=True),
    # Qwen3-30B-A3B's shape (128 experts of 768, top 8, q/k norms) on 12 of its 48 layers: 15 GB of bf16 weights
    # instead of 61, so that it fits one GPU beside a batch's KV; a step's figures are per layer the same
    "qwen3-30b-a3b-12l": replace(_config("random-qwen3-30b-a3b-12l", 151936, 2048, 6144, 12, 32, 4, 1000000.0, False),
                                 architecture="qwen3_moe", qk_norm=True, head_dim=128,
                                 moe=MoEConfig(num_experts=128, top_k=8, intermediate_size=768, norm_topk_prob=True,
                                               sparse_layers=tuple(range(12)))),
    # Llama-3.1-8B's KV layout (32 layers of 8 KV heads of 128: 128 KiB a token in bf16) on small weights:
    # what the KV transfer bench moves, in a checkpoint small enough to write there
    "kv-llama-8b": replace(_config("random-kv-llama-8b", 4096, 512, 1024, 32, 8, 8, 500000.0, False), head_dim=128),
    # Gemma-3-12B's text model (48 layers, 16/8 heads of 256, a window of 1024 on five layers of six; 23 GB of
    # bf16 weights): the GPU benchmark's sliding-window shape (decode_graphs leave it eager)
    "gemma3-12b": replace(_config("random-gemma3-12b", 262208, 3840, 15360, 48, 16, 8, 1000000.0, True),
                          architecture="gemma3", qk_norm=True, head_dim=256,
                          layer_windows=tuple(None if (i + 1) % 6 == 0 else 1024 for i in range(48)),
                          local_rope_layers=tuple(i for i in range(48) if (i + 1) % 6),
                          gemma=GemmaConfig(query_pre_attn_scalar=256, local_rope_theta=10000.0)),
    "tiny-gemma3": replace(_config("random-tiny-gemma3", 512, 128, 256, 3, 4, 2, 10000.0, True, max_position=2048),
                           architecture="gemma3", qk_norm=True, layer_windows=(16, None, 16), local_rope_layers=(0, 2),
                           gemma=GemmaConfig(query_pre_attn_scalar=32, local_rope_theta=10000.0)),
}
"""``write_random_llama_dir`` writes the Llama ones (not ``qwen3-8b``, the MoE nor Gemma: no Llama tensors)."""


def random_tensors(config: ModelConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                   seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Hugging Face-named Llama tensors, N(0, std) weights and unit norms (drawn on ``device``); a sparse
    layer's router and experts in transformers 5's stacked layout (``mlp.experts.gate_up_proj``); a Gemma
    layer's two MLP norms too (Gemma scales by ``1 + weight``: its norms are zeros), and GLM-4's norms on each
    block's output (``sandwich_norms``). A config with an ungated MLP (AFM's, Apertus's) is refused: its layers take
    no gate projection."""
    if config.mlp_activation != "swiglu":
        raise ValueError(f"{config.name}: random_tensors writes SwiGLU MLPs, not {config.mlp_activation!r} ones")
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden, inter = config.hidden_size, config.intermediate_size

    unit = torch.zeros if config.gemma is not None else torch.ones  # a norm's weight that scales by 1

    def norm(size: int) -> torch.Tensor:
        return unit(size, dtype=dtype, device=device)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)

    tensors = {"model.embed_tokens.weight": normal(config.vocab_size, hidden),
               "model.norm.weight": norm(hidden)}
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = normal(config.vocab_size, hidden)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": norm(hidden),
            p + "post_attention_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": normal(config.q_size, hidden),
            p + "self_attn.k_proj.weight": normal(config.kv_size, hidden),
            p + "self_attn.v_proj.weight": normal(config.kv_size, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, config.q_size),
        }
        if config.is_sparse_layer(i):
            moe = config.moe
            tensors |= {p + "mlp.gate.weight": normal(moe.num_experts, hidden),
                        p + "mlp.experts.gate_up_proj": normal(moe.num_experts, 2 * moe.intermediate_size, hidden),
                        p + "mlp.experts.down_proj": normal(moe.num_experts, hidden, moe.intermediate_size)}
        else:
            tensors |= {p + "mlp.gate_proj.weight": normal(inter, hidden),
                        p + "mlp.up_proj.weight": normal(inter, hidden),
                        p + "mlp.down_proj.weight": normal(hidden, inter)}
        if config.qk_norm:
            tensors |= {p + "self_attn.q_norm.weight": norm(config.head_dim),
                        p + "self_attn.k_norm.weight": norm(config.head_dim)}
        if config.gemma is not None:
            tensors |= {p + "pre_feedforward_layernorm.weight": norm(hidden),
                        p + "post_feedforward_layernorm.weight": norm(hidden)}
        if config.sandwich_norms:
            tensors |= {p + "post_self_attn_layernorm.weight": norm(hidden),
                        p + "post_mlp_layernorm.weight": norm(hidden)}
    return tensors


def random_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu",
                 seed: int = 0, fused_ops: bool = True,
                 grouped_experts: bool | None = None) -> DecoderModel:
    """A ``DecoderModel`` (the family's class) with random weights, drawn directly on ``device`` in ``dtype``
    (``fused_ops``, ``grouped_experts``: see ``DecoderModel``)."""
    return model_class(config.architecture)(config, random_tensors(config, dtype, device, seed), dtype, device,
                                            fused_ops=fused_ops, grouped_experts=grouped_experts)


def weight_bytes(config: ModelConfig, dtype_bytes: int, batch: int = 1) -> int:
    """Bytes of the weights one decode step of ``batch`` sequences reads (the embedding table is gathered,
    not read whole, unless it is also the tied LM head). A sparse layer reads its router, its shared expert
    where it has one (Qwen2-MoE), its latent projections where it has them (Nemotron 3 Super) and the experts its
    tokens pick: ``E · (1 - (1 - k/E)^batch)`` of them expected, were the routing uniform."""
    total = config.vocab_size * config.hidden_size
    for i in range(config.num_layers):
        if config.is_sparse_layer(i):
            moe, hidden = config.moe, config.hidden_size
            picked = moe.num_experts * (1 - (1 - moe.top_k / moe.num_experts) ** batch)
            projections = 3 if moe.gated_experts else 2  # gate, up, down (ungated: up, down)
            total += attention_weights(config, i) + moe.num_experts * hidden + round(
                picked * projections * (moe.latent_size or hidden) * moe.intermediate_size)
            if moe.latent_size:  # down to it and back
                total += 2 * hidden * moe.latent_size
            if moe.shared_expert_intermediate_size:  # every token's, and its gate where it has one
                total += hidden * (projections * moe.shared_expert_intermediate_size + moe.shared_expert_gated)
        else:
            total += layer_weights(config, i)
    return total * dtype_bytes


def attention_weights(config: ModelConfig, layer: int = 0) -> int:
    """Weights of ``layer``'s token mixing: its q, k, v and o projections (and an output gate's, or LFM3's gate per
    head, AFMoE's per value); a hybrid model's recurrent layer's projections (Falcon-H1's beside its attention's)."""
    hidden, linear, mamba, mamba1 = config.hidden_size, config.linear_attention, config.mamba, config.mamba1
    if layer in config.mlp_blocks:  # Nemotron-H's MLP blocks mix no tokens
        return 0
    if linear is not None and layer in linear.layers and linear.channel_decay:
        # Kimi Delta Attention: q, k, v, the gates' low-rank pairs (f_a/f_b, g_a/g_b), b and o
        width = linear.value_dim
        if linear.full_rank_gates:  # Ling 3's f_proj and g_proj
            return hidden * (linear.conv_dim + 2 * width + linear.value_heads) + width * hidden
        rank = linear.key_head_dim
        return hidden * (linear.conv_dim + 2 * rank + linear.value_heads) + 2 * rank * width + width * hidden
    if linear is not None and layer in linear.layers:
        return hidden * (linear.conv_dim + linear.value_dim + 2 * linear.value_heads) + linear.value_dim * hidden
    if config.mla is not None:  # q (through its bottleneck where it has one), the latent KV's down and up, o (and
        mla, heads = config.mla, config.num_heads  # Ling 3's gate per head)
        q = hidden * heads * mla.qk_head_dim if mla.q_lora_rank is None else \
            mla.q_lora_rank * (hidden + heads * mla.qk_head_dim)
        return q + hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim + heads * config.attention_head_gate) + \
            mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim) + heads * mla.v_head_dim * hidden
    if mamba1 is not None and layer in mamba1.layers:  # Jamba's in_proj (x, z), x_proj, dt_proj and out_proj
        return 3 * hidden * mamba1.inner + mamba1.inner * (2 * mamba1.dt_rank + 2 * mamba1.state_size)
    mixer = 0
    if mamba is not None and layer in mamba.layers:  # in_proj (z, x/B/C, dt) and out_proj
        mixer = hidden * (mamba.intermediate + mamba.conv_dim + mamba.heads) + mamba.intermediate * hidden
        if not mamba.beside_attention:
            return mixer
    if config.short_conv is not None and layer in config.short_conv.layers:  # LFM2: in_proj (B, C, x), out_proj
        return 4 * hidden * hidden
    gate = config.q_size if config.attn_output_gate or config.attention_value_gate \
        else config.num_heads if config.attention_head_gate else 0
    return mixer + hidden * (config.q_size + 2 * config.kv_size + gate) + config.q_size * hidden


def layer_weights(config: ModelConfig, layer: int) -> int:
    """Weights of ``layer``'s projections that each token multiplies: q, k, v, o and its MLP (a dense layer's
    gate, up and down, or an ungated one's up and down; a sparse layer's ``top_k`` experts')."""
    moe = config.moe
    if config.block_kinds:  # Nemotron-H: an MLP block's up and down projections (no gate), nothing in the others
        mlp = 2 * config.hidden_size * config.intermediate_size if config.block_kinds[layer] == "mlp" else 0
        return attention_weights(config, layer) + mlp
    if config.mixer_only:  # a pure state-space stack (Mamba's): the mixer alone, no MLP
        return attention_weights(config, layer)
    if config.is_sparse_layer(layer):
        return attention_weights(config, layer) + 3 * config.hidden_size * moe.top_k * moe.intermediate_size
    projections = 3 if config.mlp_activation == "swiglu" else 2  # an ungated MLP (AFM's, Apertus's): up and down
    return attention_weights(config, layer) + projections * config.hidden_size * config.intermediate_size


def write_random_llama_dir(path: Path, config: ModelConfig, seed: int = 0) -> Path:
    """A Hugging Face model directory (``config.json``, ``model.safetensors`` in bf16, a word-level
    tokenizer whose tokens are ``t0 .. t{vocab-1}``) that ``services.engine.weights`` and the tokenizer
    wrapper load like a real one. Returns ``path``."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if config.qk_norm or config.qkv_bias or config.moe is not None or config.mlp_activation != "swiglu":
        raise ValueError(f"{config.name} is not a plain Llama: write_random_llama_dir writes Llama checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    hf_config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "_name_or_path": config.name,
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position, "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id, "eos_token_id": list(config.eos_token_ids),
    }
    (path / "config.json").write_text(json.dumps(hf_config, indent=1))
    tensors = random_tensors(config, torch.bfloat16, "cpu", seed)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"))
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2")
    fast.save_pretrained(str(path))
    return path
