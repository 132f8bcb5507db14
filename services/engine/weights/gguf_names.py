"""GGUF tensor names (llama.cpp's) → the Hugging Face names :class:`DecoderModel` takes.

Every tensor of a file is accounted for: mapped to one HF name, split into one HF name per expert (the 3-D
``ffn_{gate,up,down}_exps``), kept stacked for its family to lay out (GPT-OSS's experts), read as rope settings
(``rope_freqs``), or known to be redundant and skipped (:data:`REDUNDANT`). Any other name is a
:class:`ModelLoadError` naming it, never silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.engine.errors import ModelLoadError

ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: per-dimension divisors of inv_freq (see gguf_loader)
ROPE_SHORT_FACTORS = "rope_factors_short.weight"  # Phi-3's longrope within the original context (read as metadata)
# read into the config with the metadata (``gguf_metadata.read_fields``); Phi-3's long factors are for past the
# original context, which pdserve does not serve (as of its safetensors)
_METADATA_TENSORS = frozenset({ROPE_SHORT_FACTORS, "rope_factors_long.weight"})

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",  # the MoE router
}
# [num_experts, out, in] in torch order (GGUF's ne is [in, out, num_experts]); slice j is expert j's weight
_EXPERT_NAMES = {
    "ffn_gate_exps.weight": "mlp.experts.{}.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.{}.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.{}.down_proj.weight",
}
# Where an architecture names a layer's tensors otherwise or has its own (llama.cpp's Gemma 2 and 3: ``ffn_norm``
# is the norm before the MLP, and the two norms after attention and the MLP are its own; Qwen2-MoE's and Granite
# MoE's shared experts)
GEMMA_ARCHITECTURES = ("gemma2", "gemma3")
"""llama.cpp's Gemma architectures: the norms below, stored as ``1 + weight`` (their ``<end_of_turn>``:
``gguf_config.TURN_END_TEXTS``)."""
_GEMMA_NORMS = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
# Gemma 4's layers: Gemma's four norms (stored as they are), the norms around its experts beside the MLP, the
# router's input and per-expert scales, the per-layer input's gate, projection and norm, the layer's output scale
_GEMMA4_NAMES = {**_GEMMA_NORMS,
                 "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
                 "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
                 "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
                 "ffn_gate_inp.weight": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
                 "ffn_down_exps.scale": "router.per_expert_scale",
                 "inp_gate.weight": "per_layer_input_gate.weight", "proj.weight": "per_layer_projection.weight",
                 "post_norm.weight": "post_per_layer_input_norm.weight", "layer_output_scale.weight": "layer_scalar"}
# LayerNorm families (StarCoder2's, Nemotron's, Phi-2's): the norms' biases, the MLP's
_LAYER_NORM_BIASES = {"attn_norm.bias": "input_layernorm.bias", "ffn_norm.bias": "post_attention_layernorm.bias",
                      "ffn_up.bias": "mlp.up_proj.bias", "ffn_down.bias": "mlp.down_proj.bias"}
_SHARED_EXPERT = {"ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
                  "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
                  "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight"}
# GPT-OSS: the norm after attention (before the MLP), the sinks, the router with its bias
_GPT_OSS_NAMES = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                  "attn_sinks.weight": "self_attn.sinks", "ffn_gate_inp.weight": "mlp.router.weight",
                  "ffn_gate_inp.bias": "mlp.router.bias"}
# LFM2's convolution layers (the 2-D conv weight [hidden, taps] is given its channel dim back by the family's hook)
_LFM2_NAMES = {"shortconv.conv.weight": "conv.conv.weight", "shortconv.in_proj.weight": "conv.in_proj.weight",
               "shortconv.out_proj.weight": "conv.out_proj.weight"}
# Qwen3.5's Gated DeltaNet layers and its norm after attention (the loader's hook undoes the converter's
# transforms of them: :mod:`services.engine.model.qwen3_5_gguf`)
_QWEN35_NAMES = {
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight", "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight", "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias", "post_attention_norm.weight": "post_attention_layernorm.weight"}


def _mamba_names(mixer: str) -> dict[str, str]:
    """A Mamba-2 mixer's tensors under ``mixer`` (IBM Granite 4.0's ``mamba.``, Nemotron-H's ``mixer.``; laid out by
    the family's hook, :mod:`services.engine.model.mamba_gguf`)."""
    leaves = {"ssm_in.weight": "in_proj.weight", "ssm_conv1d.weight": "conv1d.weight", "ssm_conv1d.bias": "conv1d.bias",
              "ssm_dt.bias": "dt_bias", "ssm_a": "A_log", "ssm_d": "D", "ssm_norm.weight": "norm.weight",
              "ssm_out.weight": "out_proj.weight"}
    return {name: mixer + leaf for name, leaf in leaves.items()}


_OUTPUT_NORMS = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                 "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
_NEMOTRON_H_NAMES = {**_mamba_names("mixer."), "attn_q.weight": "mixer.q_proj.weight",
                     "attn_k.weight": "mixer.k_proj.weight", "attn_v.weight": "mixer.v_proj.weight",
                     "attn_output.weight": "mixer.o_proj.weight", "ffn_up.weight": "mixer.up_proj.weight",
                     "ffn_down.weight": "mixer.down_proj.weight"}
# DeepSeek's latent attention (the MLA files' split kv_b is stacked below, for its family's hook), its router's
# correction bias, its shared experts
_DEEPSEEK2_NAMES = {"attn_q_a.weight": "self_attn.q_a_proj.weight",
                    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
                    "attn_q_b.weight": "self_attn.q_b_proj.weight",
                    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
                    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
                    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
                    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias", **_SHARED_EXPERT}
# a Mamba-1 layer's (Jamba's, a pure Mamba's: Falcon-Mamba's inner norms have no weight, its files hold none)
_MAMBA1_NAMES = {f"ssm_{leaf}": f"mamba.{name}" for leaf, name in (
    ("in.weight", "in_proj.weight"), ("conv1d.weight", "conv1d.weight"), ("conv1d.bias", "conv1d.bias"),
    ("x.weight", "x_proj.weight"), ("dt.weight", "dt_proj.weight"), ("dt.bias", "dt_proj.bias"), ("a", "A_log"),
    ("d", "D"), ("dt_norm.weight", "dt_layernorm.weight"), ("b_norm.weight", "b_layernorm.weight"),
    ("c_norm.weight", "c_layernorm.weight"), ("out.weight", "out_proj.weight"))}
_ARCH_LAYER_NAMES = {
    # the shared expert and its gate; Granite MoE's shared MLP has no gate
    "qwen2moe": {"ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight", **_SHARED_EXPERT},
    "granitemoe": _SHARED_EXPERT,
    "hunyuan-moe": _SHARED_EXPERT,
    **dict.fromkeys(("starcoder2", "nemotron"), _LAYER_NORM_BIASES),
    # Phi-2's: its older files' fused q/k/v (``mixer.Wqkv``), read as the shared decoder's qkv_proj; GPT-NeoX's, its
    # q, k, v regrouped by its converter
    **{arch: {**_LAYER_NORM_BIASES, "attn_qkv.weight": "self_attn.qkv_proj.weight",
              "attn_qkv.bias": "self_attn.qkv_proj.bias"} for arch in ("phi2", "gptneox")},
    "llama4": _SHARED_EXPERT,
    **dict.fromkeys(GEMMA_ARCHITECTURES, _GEMMA_NORMS),
    "gpt-oss": _GPT_OSS_NAMES,
    "lfm2": _LFM2_NAMES,
    "gemma4": _GEMMA4_NAMES,
    "deepseek2": _DEEPSEEK2_NAMES,
    "mistral4": _DEEPSEEK2_NAMES,
    # Phi-3's fused q/k/v and gate/up (gate rows first), as its checkpoints store them
    "phi3": {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"},
    # GLM-4-0414's: the norms after attention and after the MLP, the one before the MLP; gate/up fused
    "glm4": {"post_attention_norm.weight": "post_self_attn_layernorm.weight",
             "ffn_norm.weight": "post_attention_layernorm.weight",
             "post_ffw_norm.weight": "post_mlp_layernorm.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"},
    # GLM-4.5's: the norm before the MLP, the router's correction bias, the shared experts
    "glm4moe": {"post_attention_norm.weight": "post_attention_layernorm.weight",
                "exp_probs_b.bias": "mlp.gate.e_score_correction_bias", **_SHARED_EXPERT},
    "qwen35": _QWEN35_NAMES,
    "qwen35moe": {**_QWEN35_NAMES, "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight", **_SHARED_EXPERT},
    # Qwen3-Next's: Qwen3.5-MoE's, its b and a projections fused (``ssm_ba``); older files hold q/k/v/z fused too, as
    # the checkpoint does (``ssm_in``)
    "qwen3next": {**_QWEN35_NAMES, "ssm_ba.weight": "linear_attn.in_proj_ba.weight",
                  "ssm_in.weight": "linear_attn.in_proj_qkvz.weight",
                  "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight", **_SHARED_EXPERT},
    # OLMo 2's and 3's norms on the blocks' outputs (none on their inputs); EXAONE 4.0's, the same
    "olmo2": _OUTPUT_NORMS,
    "exaone4": _OUTPUT_NORMS,
    # Seed-OSS's norm before the MLP, which its converter names as a norm after attention
    "seed_oss": {"post_attention_norm.weight": "post_attention_layernorm.weight"},
    # the routers' correction bias; ERNIE 4.5's and dots.llm1's shared experts
    "minimax-m2": {"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"},
    "ernie4_5-moe": {"exp_probs_b.bias": "mlp.gate.e_score_correction_bias", **_SHARED_EXPERT},
    "dots1": {"exp_probs_b.bias": "mlp.gate.e_score_correction_bias", **_SHARED_EXPERT},
    # IBM Granite 4.0's Mamba-2 mixers and shared MLP
    "granitehybrid": {**_mamba_names("mamba."), **_SHARED_EXPERT},
    # Jamba's Mamba (Mamba-1) layers (laid out by its family's hook, mamba_gguf.mamba_from_gguf); a pure Mamba's alike
    **dict.fromkeys(("jamba", "mamba"), _MAMBA1_NAMES),
    # a pure Mamba-2's mixers, as Granite 4.0's
    "mamba2": _mamba_names("mamba."),
    # Falcon-H1's Mamba-2 mixers, and its norm before the MLP, which its converter writes without ``.weight``
    "falcon-h1": {**_mamba_names("mamba."), "ffn_norm": "post_attention_layernorm.weight"},
    # Nemotron-H's blocks: one norm and one mixer each (Mamba-2, attention or a squared-ReLU MLP)
    "nemotron_h": _NEMOTRON_H_NAMES,
    # Nemotron 3's: the same, and its experts' router, correction bias, shared MLP and latent projections (the experts
    # themselves stacked below)
    "nemotron_h_moe": {**_NEMOTRON_H_NAMES, "ffn_gate_inp.weight": "mixer.gate.weight",
                       "exp_probs_b.bias": "mixer.gate.e_score_correction_bias",
                       "ffn_up_shexp.weight": "mixer.shared_expert.up_proj.weight",
                       "ffn_down_shexp.weight": "mixer.shared_expert.down_proj.weight",
                       "ffn_latent_down.weight": "mixer.fc1_latent_proj.weight",
                       "ffn_latent_up.weight": "mixer.fc2_latent_proj.weight"},
    # LFM2-MoE's router correction bias (``expert_bias``), which llama.cpp's converter names exp_probs_b.bias
    "lfm2moe": {**_LFM2_NAMES, "exp_probs_b.bias": "mlp.gate.e_score_correction_bias"},
}
# LFM2's final norm (its ``embedding_norm``) as llama.cpp names it
_ARCH_GLOBAL_NAMES = {arch: {"token_embd_norm.weight": "model.norm.weight"} for arch in ("lfm2", "lfm2moe")}
_ARCH_GLOBAL_NAMES.update({arch: {"output_norm.bias": "model.norm.bias"}
                           for arch in ("starcoder2", "nemotron", "gptneox")})
_ARCH_GLOBAL_NAMES["phi2"] = {"output_norm.bias": "model.norm.bias", "output.bias": "lm_head.bias"}
# Gemma 4's per-layer inputs: their embedding, the projection of the token's embedding and its norm
_ARCH_GLOBAL_NAMES["gemma4"] = {"per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
                                "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
                                "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight"}
_KV_B_HALVES = {"attn_k_b.weight": "self_attn.gguf_k_b", "attn_v_b.weight": "self_attn.gguf_v_b"}
# Experts kept stacked, under these names, for their family's loader hook to lay out as transformers holds them
# (``Family.gguf_tensors``; GPT-OSS's experts, each projection with a bias: [E, out, in] and [E, out]), or as its
# decoder reads them
_STACKED_NAMES = {
    # Gemma 4's, as transformers holds them: gate and up fused [E, 2 * inter, hidden], down [E, hidden, inter]
    "gemma4": {"ffn_gate_up_exps.weight": "experts.gate_up_proj", "ffn_down_exps.weight": "experts.down_proj"},
    # DeepSeek's kv_b_proj as the MLA files split it: [H, kv_lora, nope] and [H, v, kv_lora]
    "deepseek2": _KV_B_HALVES,
    # Mistral 4's: DeepSeek's, and its experts as transformers 5 holds them (gate and up fused, gate rows first)
    "mistral4": {**_KV_B_HALVES, "ffn_gate_up_exps.weight": "mlp.experts.gate_up_proj",
                 "ffn_down_exps.weight": "mlp.experts.down_proj"},
    # Nemotron 3's, as transformers 5 holds them ([E, inter, width] and [E, width, inter]: no gate)
    "nemotron_h_moe": {"ffn_up_exps.weight": "mixer.experts.up_proj",
                       "ffn_down_exps.weight": "mixer.experts.down_proj"},
    "gpt-oss": {f"ffn_{proj}_exps.{kind}": f"mlp.experts.gguf_{proj}.{kind}"
                for proj in ("gate", "up", "down") for kind in ("weight", "bias")},
}
NORM_OFFSETS = dict.fromkeys((*GEMMA_ARCHITECTURES, "gemma", "qwen35", "qwen35moe", "qwen3next", "nemotron"), 1.0)
"""What llama.cpp's converter adds to every ``*norm.weight`` of an architecture (Gemma 1's, 2's and 3's, Nemotron's
LayerNorm1P, Qwen3.5's and Qwen3-Next's ``1 + weight`` scale, stored whole) but those of :data:`UNOFFSET_NORMS`; the
loader takes it off again, as the model adds it itself."""
UNOFFSET_NORMS = frozenset({"ssm_norm.weight"})  # Qwen3.5's gated norm in its DeltaNet layers: a plain scale


def norm_offset(architecture: str, gguf_name: str) -> float:
    """What llama.cpp added to this tensor of an ``architecture`` file (0: nothing; see :data:`NORM_OFFSETS`)."""
    if not gguf_name.endswith("norm.weight") or gguf_name.rsplit(".", 2)[-2] + ".weight" in UNOFFSET_NORMS:
        return 0.0
    return NORM_OFFSETS.get(architecture, 0.0)
# Redundant tensors, skipped: ``attn_rot_embd`` is the rotary ``inv_freq`` buffer that old conversions
# stored per layer; the rope tables are recomputed from the metadata (as for safetensors' rotary_emb.inv_freq).
REDUNDANT = frozenset({"attn_rot_embd"})
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
# Mixtral files converted before llama.cpp stacked experts (early 2024): one 2-D tensor per expert and projection
_ONE_EXPERT_RE = re.compile(r"^ffn_(gate|up|down)\.(\d+)\.weight$")


@dataclass(frozen=True)
class TensorRole:
    """What one GGUF tensor becomes: ``kind`` is ``"weight"`` (one HF tensor, ``hf_name``), ``"experts"``
    (``hf_name`` is a pattern with ``{}`` for the expert index), ``"stacked"`` (kept whole as ``hf_name``, for its
    family's loader hook), ``"rope_freqs"``, ``"metadata"`` (read into the config with the metadata) or
    ``"redundant"``."""

    kind: str
    hf_name: str = ""

    def expert_name(self, expert: int) -> str:
        return self.hf_name.format(expert)


def tensor_role(gguf_name: str, architecture: str = "") -> TensorRole:
    """The role of ``gguf_name`` in a file of ``architecture`` (its ``general.architecture``); raises
    :class:`ModelLoadError` for a name this loader does not know."""
    if gguf_name in (names := {**_GLOBAL_NAMES, **_ARCH_GLOBAL_NAMES.get(architecture, {})}):
        return TensorRole("weight", names[gguf_name])
    if gguf_name == ROPE_FREQS:
        return TensorRole("rope_freqs")
    if gguf_name in _METADATA_TENSORS:
        return TensorRole("metadata")
    match = _LAYER_RE.match(gguf_name)
    if match:
        layer, rest = match.group(1), match.group(2)
        prefix = f"model.layers.{layer}."
        names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(architecture, {})}
        if rest in names:
            return TensorRole("weight", prefix + names[rest])
        if rest in (stacked := _STACKED_NAMES.get(architecture, {})):
            return TensorRole("stacked", prefix + stacked[rest])
        if rest in _EXPERT_NAMES:
            return TensorRole("experts", prefix + _EXPERT_NAMES[rest])
        if (one := _ONE_EXPERT_RE.match(rest)) is not None:
            return TensorRole("weight", prefix + f"mlp.experts.{one.group(2)}.{one.group(1)}_proj.weight")
        if rest in REDUNDANT:
            return TensorRole("redundant")
    raise ModelLoadError(f"GGUF tensor {gguf_name!r} is not one pdserve knows (a feature of another architecture "
                         "or variant that it cannot serve exactly); refusing rather than ignoring it")
