"""Model architecture description shared by loaders, the model and the KV cache."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kernels.rope_scaling import RopeScaling
from services.engine.errors import ModelLoadError
from services.engine.model.attention_config import LatentAttention, MiMoAttention, SparseIndex  # noqa: F401
from services.engine.model.moe_config import MoEConfig
from services.engine.model.recurrent_config import LinearAttention, Mamba1, Mamba2, ShortConv

if TYPE_CHECKING:
    from services.engine.model.falcon_h1 import FalconH1Scales
    from services.engine.model.gemma4_config import Gemma4Config
    from services.engine.model.llama4 import Llama4Attention


@dataclass(frozen=True)
class GemmaConfig:
    """What Gemma 1, 2 and 3 change in the decoder (:mod:`services.engine.model.gemma_decoder`): RMSNorm scaled by
    ``1 + weight``, norms after attention and the MLP as well as before (Gemma 2's and 3's: ``post_norms``),
    embeddings times ``sqrt(hidden)``, a GELU (tanh) gated MLP, attention scaled by ``query_pre_attn_scalar **
    -0.5``, and the sliding-window layers' own rope base (no scaling; Gemma 2's is the full layers' base)."""

    query_pre_attn_scalar: float
    local_rope_theta: float
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    # norms on the attention's and the MLP's outputs (Gemma 2 and 3); Gemma 1 has the norms before them only, the
    # one before the MLP named ``post_attention_layernorm``
    post_norms: bool = True


@dataclass(frozen=True)
class Multipliers:
    """IBM Granite's four scalars: embeddings times ``embedding``, attention scores scaled by ``attention``
    (instead of ``head_dim ** -0.5``), each block's output times ``residual`` before it joins the residual
    stream, and the logits divided by ``logits_divisor``; Cohere's logits times ``logits_scale``; MiniCPM3's final
    hidden state divided by ``head_input_divisor`` before the head."""

    embedding: float = 1.0
    attention: float | None = None  # None: head_dim ** -0.5
    residual: float = 1.0
    logits_divisor: float = 1.0
    logits_scale: float = 1.0
    head_input_divisor: float = 1.0  # MiniCPM3's: the final hidden state divided before the head (model dtype)

    def __post_init__(self) -> None:
        if not self.logits_divisor or not self.head_input_divisor:
            raise ModelLoadError("the logits divisor (logits_scaling) must not be 0")


def windowed_layers(windows: tuple[int | None, ...]) -> tuple[int, ...]:
    """The layers of ``windows`` (``ModelConfig.layer_windows``) that have one: a checkpoint's sliding layers, as
    ``ModelConfig.local_rope_layers`` keeps them."""
    return tuple(i for i, window in enumerate(windows) if window is not None)


def full_layers(windows: tuple[int | None, ...]) -> tuple[int, ...]:
    """The layers of ``windows`` that have none (Cohere 2's and EXAONE 4.0's global layers, which their rope skips)."""
    return tuple(i for i, window in enumerate(windows) if window is None)


MLP_ACTIVATIONS = ("swiglu", "relu2", "xielu", "gelu_tanh", "gelu")  # ModelConfig.mlp_activation's


@dataclass(frozen=True)
class ModelConfig:
    """Shape and constants of a decoder of the Llama family (Llama, SmolLM3, Granite, Granite MoE, Qwen2, Qwen3,
    Mistral, Mistral 3, Mixtral, Qwen2-MoE, Qwen3-MoE, Phi-3, Gemma 2, Gemma 3, Gemma 4, GPT-OSS, GLM-4, GLM-4.5,
    ERNIE 4.5, OLMo 2, DeepSeek-V2/V3, Llama 4, GLM-4.7-Flash, MiniMax-M2, OLMoE, and the hybrids Qwen3.5, Qwen3-Next,
    Granite 4.0, LFM2 and Nemotron-H).

    ``architecture`` names the family in :mod:`services.engine.model.registry`; the optional features
    (biases, q/k norms, experts, rope scaling, sliding-window layers) are what the families differ in.
    """

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position: int  # the longest sequence served exactly
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    architecture: str = "llama"
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k before rope (Qwen3)
    qk_norm_whole: bool = False  # the q/k norms span all heads at once (MiniMax-M2's), not each head
    qk_norm_after_rope: bool = False  # the per-head q/k norms follow rope (Hunyuan's), not precede it
    # each head's attention output times the sigmoid of its row of ``self_attn.g_proj`` over the layer's normed
    # input (LFM3's; ``[num_heads, hidden]``); ``attention_value_gate``: each value of it, by its own row
    # (Arcee's AFMoE; ``[q_size, hidden]``)
    attention_head_gate: bool = False
    attention_value_gate: bool = False
    # q and k rotate in float32 with float32 tables, rounded once after (LFM3's, OLMo's, OLMo 2's, ERNIE 4.5's; where
    # the rope is torch's: FlashInfer's fused kernel computes in float32 itself)
    rope_in_float32: bool = False
    # the dense MLP: SwiGLU (gate and up), or ungated ``down(act(up(x)))`` with a squared ReLU (Arcee's AFM and
    # Jais 2, "relu2"), xIELU with each layer's learned parameters (Apertus, "xielu"), the tanh GELU (StarCoder2,
    # "gelu_tanh") or the exact one (GPT-NeoX's, "gelu")
    mlp_activation: str = "swiglu"
    mlp_bias: bool = False  # the dense MLP's projections have biases (StarCoder2's, Jais 2's)
    # every norm is a LayerNorm with a weight and a bias, of epsilon ``rms_norm_eps`` (StarCoder2's, Jais 2's,
    # Phi-3.5-MoE's; their layers: :mod:`services.engine.model.layernorm_decoder`), not an RMSNorm
    layer_norm: bool = False
    layer_norm_plus_one: bool = False  # the LayerNorms scale by ``1 + weight`` (Nemotron's LayerNorm1P)
    # attention and the MLP side by side on the layer's one LayerNorm, ``h += attention(x) + mlp(x)`` (Phi-1's and
    # Phi-2's, StableLM's with use_parallel_residual; Cohere's layer is its own)
    parallel_blocks: bool = False
    # with parallel_blocks, the MLP on a LayerNorm of its own of the layer's input, ``h += attention(ln_1(h)) +
    # mlp(ln_2(h))`` (GPT-NeoX's use_parallel_residual)
    parallel_mlp_norm: bool = False
    lm_head_bias: bool = False  # the LM head has a bias (``lm_head.bias``: Phi-3.5-MoE's)
    # the LM head's rows where fewer than the embedding's (Apertus 1.5's head, pruned to its text ids): the ids past it
    # are never sampled (their logits are -inf); None: vocab_size rows
    output_vocab_size: int | None = None
    # Cohere's layer (:mod:`services.engine.model.cohere_decoder`) with RMSNorms for its LayerNorms (Cohere 2 MoE's,
    # where its config sets ``rms_norm_eps``)
    cohere_rms_norms: bool = False
    moe: MoEConfig | None = None
    layer_windows: tuple[int | None, ...] = ()
    """Per layer: the sliding window of its attention (a query at position p sees positions p-W+1..p), None
    for full attention; empty: every layer full. Served exactly at any length."""
    gemma: GemmaConfig | None = None
    # Gemma 4's layers (heads per layer in one KV slot, KV shared across layers, per-layer inputs; then
    # ``num_kv_heads`` and ``head_dim`` are the KV cache's slot, and the rope is the full layers')
    gemma4: Gemma4Config | None = None
    # MiMo-V2-Flash's attention: KV heads per layer (``num_kv_heads`` the widest, the cache's slot), values narrower
    # than the keys, a value scale, sinks on some layers (:mod:`services.engine.model.mimo_decoder`)
    mimo: MiMoAttention | None = None
    rotary_dim: int | None = None  # the leading dims of a head that rope rotates (partial_rotary_factor); None: all
    attention_sinks: bool = False  # a learned logit per head joins each softmax (GPT-OSS; the layers' ``sinks``)
    attn_logit_softcap: float | None = None  # every attention score s becomes cap * tanh(s / cap) (Gemma 2)
    clip_qkv: float | None = None  # q, k and v each clamped to [-clip, clip] after their projections (OLMo 1.7's)
    final_logit_softcap: float | None = None  # logits become cap * tanh(logits / cap) (nanochat; Gemma: GemmaConfig's)
    multipliers: Multipliers | None = None  # Granite's embedding, attention, residual and logits scalars
    nope_layers: tuple[int, ...] = ()  # layers whose q and k rope does not rotate (SmolLM3's NoPE layers)
    rope_interleaved: bool = False  # rope rotates pairs of adjacent dims (GLM-4's), not the two halves
    # a norm on the attention's and the MLP's output before each joins the residual stream (GLM-4's
    # post_self_attn_layernorm and post_mlp_layernorm), beside the usual two before them
    sandwich_norms: bool = False
    # the layers that rotate with a plain rope of their own base (Gemma 3's and OLMo 3's sliding layers, as the
    # checkpoint names them: also where serving drops a window that hides nothing, :meth:`served_within`), and that
    # base (Gemma's is ``GemmaConfig.local_rope_theta``)
    local_rope_layers: tuple[int, ...] = ()
    local_rope_theta: float | None = None
    # multi-head latent attention: the KV cache has one head of ``mla.cache_dim`` (``num_kv_heads`` 1, ``head_dim``
    # the cache row, ``rotary_dim`` its rope key)
    mla: LatentAttention | None = None
    # hybrid models: the layers whose token mixing is a recurrent state (no KV), and what it is
    linear_attention: LinearAttention | None = None
    mamba: Mamba2 | None = None
    short_conv: ShortConv | None = None
    mamba1: Mamba1 | None = None
    # Falcon-H1's muP scales (a Mamba-2 mixer beside every layer's attention: ``mamba.beside_attention``)
    falcon_h1: FalconH1Scales | None = None
    # every layer one norm and one recurrent token mixer, no MLP and no attention: a pure state-space stack (Mamba's,
    # :mod:`services.engine.model.state_space_decoder`), the only kind of model without KV
    mixer_only: bool = False
    # the residual stream kept in float32, each layer's norm fed its rounding to the model dtype and the final norm the
    # float32 stream (Mamba's ``residual_in_fp32``: :mod:`services.engine.model.state_space_decoder`)
    residual_in_float32: bool = False
    # Nemotron-H's blocks, one mixer each: "mamba", "attention" or "mlp" per layer (an MLP block mixes no tokens
    # and keeps no KV); empty: every layer is a token mixer followed by an MLP
    block_kinds: tuple[str, ...] = ()
    # the attention's output is multiplied by the sigmoid of a gate the q projection also gives (Qwen3.5's and
    # Qwen3-Next's full-attention layers: each head's q rows, then its gate rows)
    attn_output_gate: bool = False
    # Ministral 3's (and Llama 4's) attention temperature: after rope, the queries at position p are multiplied by
    # ``1 + beta * log(1 + floor(p / period))`` (``llama_4_scaling_beta``; the period is the yarn's original
    # context), which is 1 within the first period; beta 0: none
    query_temperature_beta: float = 0.0
    query_temperature_period: int = 0
    # Llama 4's attention: q/k L2 norms after rope, a query temperature on the unrotated layers
    llama4: Llama4Attention | None = None
    # chunked attention (Llama 4's rotated layers): a query at position p of a layer in ``chunked_layers`` sees the
    # positions ``p - p % attention_chunk .. p`` only (kernels.attention.chunked); None: every layer full
    attention_chunk: int | None = None
    chunked_layers: tuple[int, ...] = ()
    # the positions the rope tables hold, where fewer than ``max_position`` (:meth:`served_within`: no sequence outgrows
    # the node's KV pool); None: ``max_position``
    rope_positions: int | None = None

    def __post_init__(self) -> None:
        if (self.layer_norm_plus_one or self.parallel_blocks) and not self.layer_norm:
            raise ModelLoadError("layer_norm_plus_one and parallel_blocks need layer_norm (the LayerNorm decoder's)")
        if self.parallel_mlp_norm and not self.parallel_blocks:
            raise ModelLoadError("parallel_mlp_norm needs parallel_blocks (the MLP's own norm in a parallel layer)")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise ModelLoadError(f"mlp_activation {self.mlp_activation!r} is not one of {', '.join(MLP_ACTIVATIONS)}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "max_position"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config {name} must be >= 1, got {getattr(self, name)}")
        if self.output_vocab_size is not None and (not 0 < self.output_vocab_size < self.vocab_size
                                                   or self.tie_word_embeddings):
            raise ModelLoadError(f"an LM head of {self.output_vocab_size} rows must be untied and have fewer rows than "
                                 f"the {self.vocab_size} of the embedding (tied: {self.tie_word_embeddings})")
        if self.output_vocab_size is not None and (self.gemma is not None or self.gemma4 is not None):
            raise ModelLoadError("a pruned LM head is not served with Gemma's logit softcap (its decoders cap the "
                                 "logits after the head)")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"{self.num_heads} heads do not divide into {self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rotary_dim is not None and (self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim):
            raise ModelLoadError(f"the rotary dim must be even and in [2, head_dim={self.head_dim}], got "
                                 f"{self.rotary_dim}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelLoadError(f"{len(self.layer_windows)} layer windows for {self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise ModelLoadError(f"a sliding window must be >= 1, got {self.layer_windows}")
        if any(not 0 <= layer < self.num_layers for layer in self.nope_layers):
            raise ModelLoadError(f"NoPE layers {self.nope_layers} outside the {self.num_layers} layers")
        if self.attention_chunk is not None and (self.attention_chunk < 1 or not self.chunked_layers):
            raise ModelLoadError(f"an attention chunk must be >= 1 and name its layers, got {self.attention_chunk} "
                                 f"on layers {self.chunked_layers}")
        if any(not 0 <= layer < self.num_layers for layer in self.chunked_layers) or (
                self.chunked_layers and self.attention_chunk is None):
            raise ModelLoadError(f"chunked layers {self.chunked_layers} must be some of the {self.num_layers} layers, "
                                 "with an attention chunk")
        if self.query_temperature_beta and self.query_temperature_period < 1:
            raise ModelLoadError(f"a query temperature (beta {self.query_temperature_beta}) needs a period >= 1, got "
                                 f"{self.query_temperature_period}")
        if self.clip_qkv is not None and not self.clip_qkv > 0:
            raise ModelLoadError(f"clip_qkv must be > 0, got {self.clip_qkv}")
        if self.attn_logit_softcap is not None and not self.attn_logit_softcap > 0:
            raise ModelLoadError(f"the attention logit softcap must be > 0, got {self.attn_logit_softcap}")
        if sum(kind is not None for kind in (self.linear_attention, self.mamba, self.short_conv, self.mamba1)) > 1:
            raise ModelLoadError("a model has one kind of recurrent layer (Gated DeltaNet, Mamba-2, short "
                                 "convolutions or Mamba-1), not several")
        recurrent = self.recurrent
        if recurrent is not None and (not recurrent.layers or len(recurrent.layers) > self.num_layers
                                      or any(not 0 <= i < self.num_layers for i in recurrent.layers)):
            raise ModelLoadError(f"recurrent layers {recurrent.layers} must be some of the {self.num_layers} layers")
        if self.block_kinds and (len(self.block_kinds) != self.num_layers
                                 or set(self.block_kinds) - {"mamba", "attention", "mlp", "moe"}
                                 or tuple(i for i, k in enumerate(self.block_kinds) if k == "mamba")
                                 != (() if self.mamba is None else self.mamba.layers)
                                 or tuple(i for i, k in enumerate(self.block_kinds) if k == "moe")
                                 != (() if self.moe is None else self.moe.sparse_layers)):
            raise ModelLoadError(f"block kinds {self.block_kinds} must name each of the {self.num_layers} layers "
                                 "mamba (its Mamba-2 layers), attention, mlp or moe (its sparse layers)")
        if self.mixer_only and (self.recurrent is None or self.recurrent.layers != tuple(range(self.num_layers))):
            raise ModelLoadError("a mixer-only model's every layer is a recurrent mixer (a pure state-space stack)")
        if not self.kv_layers and not self.mixer_only:
            raise ModelLoadError("no attention layer: at least one is needed (its KV cache; only a pure state-space "
                                 "model, Mamba's, keeps none)")
        if self.gemma4 is not None:
            self.gemma4.check_fits(self.num_heads, self.kv_size)
        mla = self.mla
        if mla is not None and (self.num_kv_heads, self.head_dim, self.rotary_dim) != (1, mla.cache_dim,
                                                                                         mla.qk_rope_head_dim):
            raise ModelLoadError(f"latent attention caches one head of {mla.cache_dim} dims rotating the first "
                                 f"{mla.qk_rope_head_dim}, not {self.num_kv_heads} of {self.head_dim} rotating "
                                 f"{self.rotary_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers that keep KV (a hybrid model's attention layers; all but Gemma 4's KV-sharing ones; every layer
        otherwise), in order: the KV cache's layer ``n`` is layer ``kv_layers[n]``'s."""
        recurrent = self.recurrent
        beside = isinstance(recurrent, Mamba2) and recurrent.beside_attention
        stateful = () if recurrent is None or beside else recurrent.layers
        mixing = set(self.mlp_blocks) | set(stateful)
        if self.gemma4 is not None:
            mixing |= set(self.gemma4.shared_layers)
        return tuple(i for i in range(self.num_layers) if i not in mixing)

    @property
    def attention_free(self) -> bool:
        """No layer keeps KV (``mixer_only``: a pure state-space model, Mamba's): its KV blocks hold no bytes and only
        count the tokens of a sequence (the scheduler's and the prefix index's unit); its states are all it keeps."""
        return not self.kv_layers

    @property
    def mlp_blocks(self) -> tuple[int, ...]:
        """The layers that are an MLP alone, dense or sparse (``block_kinds`` mlp or moe)."""
        return tuple(i for i, kind in enumerate(self.block_kinds) if kind in ("mlp", "moe"))

    @property
    def recurrent(self) -> LinearAttention | Mamba2 | ShortConv | Mamba1 | None:
        """The layers that carry a per-sequence state, and its shape (a hybrid model's): instead of KV, or beside it
        (Falcon-H1's, ``Mamba2.beside_attention``)."""
        return self.linear_attention or self.mamba or self.short_conv or self.mamba1

    @property
    def has_recurrent_state(self) -> bool:
        """Some layers carry a per-sequence state beside the KV (a hybrid model)."""
        return self.recurrent is not None

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * len(self.kv_layers) * self.kv_size * dtype_bytes

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer``'s attention (None: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def has_windows(self) -> bool:
        return any(w is not None for w in self.layer_windows)

    def chunk(self, layer: int) -> int | None:
        """The attention chunk of ``layer`` (None: its attention is not chunked)."""
        return self.attention_chunk if layer in self.chunked_layers else None

    @property
    def rope_length(self) -> int:
        """The positions a rope table holds: ``rope_positions``, else ``max_position``."""
        return min(self.rope_positions or self.max_position, self.max_position)

    def served_within(self, max_len: int | None, kv_tokens: int | None = None) -> ModelConfig:
        """This config served at most ``max_len`` tokens (None: ``max_position``) from a KV pool of ``kv_tokens`` (None:
        unbounded): its positions cut to that length, the rope tables to the pool's tokens where fewer (no sequence
        outgrows its pool: Llama 4 Scout's 10M positions would take ~5 GiB of float32 tables each on the host and the
        GPU), and a window or an attention chunk that long or longer, which hides nothing there, dropped, so that
        such a model keeps what windows cost (the CPU kernel on every layer, CUDA graphs, the deterministic mode).
        The KV is the same either way."""
        length = min(max_len or self.max_position, self.max_position)
        windows = tuple(None if w is None or w >= length else w for w in self.layer_windows)
        chunked = self.attention_chunk is not None and self.attention_chunk < length
        return replace(self, max_position=length, layer_windows=windows if any(w is not None for w in windows) else (),
                       attention_chunk=self.attention_chunk if chunked else None,
                       chunked_layers=self.chunked_layers if chunked else (),
                       rope_positions=kv_tokens if kv_tokens is not None and kv_tokens < length else None)

    def is_sparse_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.sparse_layers
