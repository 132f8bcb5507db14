"""The decoder every supported family shares (RMSNorm, RoPE, GQA, SwiGLU (or an ungated MLP: squared ReLU, xIELU) or
sparse experts, optionally tied embeddings, q/k/v biases and per-head q/k norms) over a paged KV cache.

The model is a plain object holding fused weight tensors (q/k/v in one matrix, gate/up in one matrix),
not an ``nn.Module``: a decode step is ~15 torch calls per layer and nothing else. A family differs only
in its :class:`ModelConfig` (see :mod:`services.engine.model.registry`). The elementwise steps between the
projections (residual add + norm, SiLU-and-multiply, rope) go through ``self.ops``: torch's, or FlashInfer's
fused kernels on CUDA (:mod:`kernels.fused_ops`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar

import structlog
import torch
import torch.nn.functional as F

from kernels.fused_ops import Float32Rope, TorchRope
from kernels.int4_linear import GroupQuantized, int4_supported
from kernels.linear import INT4_ALL_ROWS, INVARIANT_ROW_BLOCK, LinearWeight, RowPaths, linear, prepare_linear
from kernels.norm import rms_norm
from kernels.rope import RotaryEmbedding
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.fused_choice import choose_fused_ops
from services.engine.model.moe import MoEWeights, moe_forward
from services.engine.model.moe_grouped import grouped_experts_problem
from services.engine.model.moe_loading import ExpertLoading
from services.engine.model.typed_ropes import TypedRopes
from services.engine.model.weight_source import WeightSource

log = structlog.get_logger(__name__)

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: LinearWeight  # [q_size + 2 * kv_size, hidden]
    o: LinearWeight
    post_norm: torch.Tensor
    # [2 * intermediate, hidden] (an ungated MLP's: its up projection, [intermediate, hidden]); None in a sparse layer
    gate_up: LinearWeight | None
    down: LinearWeight | None
    q_norm: torch.Tensor | None = None  # [head_dim] (Qwen3); [q_size] with ModelConfig.qk_norm_whole
    k_norm: torch.Tensor | None = None
    moe: MoEWeights | None = None
    sinks: torch.Tensor | None = None  # [num_heads] float32: the attention sinks' logits (GPT-OSS)
    attn_out_norm: torch.Tensor | None = None  # [hidden]: sandwich norms (GLM-4), on each block's output
    mlp_out_norm: torch.Tensor | None = None
    # [num_heads or q_size, hidden]: ModelConfig.attention_head_gate's (LFM3) or attention_value_gate's (AFMoE)
    output_gate: LinearWeight | None = None
    xielu: XIELUParameters | None = None  # an Apertus layer's activation (ModelConfig.mlp_activation "xielu")


class DecoderModel(ExpertLoading):
    """``quantized``: 4-bit codes of some weights (a Q4 GGUF file's own); with ``int4_max_rows`` > 0, where
    torch's int4 kernel runs (bf16 on CPU), projections of at most that many rows use them.
    ``self.int4_max_rows`` is what is in effect (0: every product is dense).

    ``deterministic``: every row's numbers independent of the step's row count (see :mod:`kernels.linear`):
    dense products run in blocks of :data:`INVARIANT_ROW_BLOCK` rows, and with :meth:`forward`'s ``paths``
    (the model runner's: prompt positions dense, output positions 4-bit) each projection row takes the path
    of its position's kind; without them the 4-bit weights, where there are, serve every step size
    (``int4_max_rows`` becomes :data:`INT4_ALL_ROWS`).

    ``fused_ops``: on a CUDA device in bf16/fp16 outside the deterministic mode, the residual add and RMSNorm,
    SiLU-and-multiply and rope run FlashInfer's fused kernels, each checked against torch at load
    (``self.ops``, see :mod:`services.engine.model.fused_choice`); False, or any other model: the torch ops.
    ``flashinfer_module``: a stand-in for ``flashinfer`` there (tests run the fused path on a CPU with one).

    ``grouped_experts``: a sparse layer's experts stacked and run as two grouped GEMMs with no host sync
    (:mod:`services.engine.model.moe_grouped`; a MoE model's decode can then be captured in CUDA graphs).
    None: on a CUDA device outside the deterministic mode, where ``grouped_mm`` passes its load check there
    (else the per-expert loop, logged); True: everywhere (tests run it on a CPU); False: never.

    Raises :class:`ModelLoadError` naming the tensor when one is missing, misshapen, not a float, or left
    over (a feature of the checkpoint this family does not have)."""

    FUSED_OPS: ClassVar[bool] = True  # a family whose layer calls torch's ops directly sets it False
    # a family whose own ``_attention`` multiplies its queries by ``query_scale`` (the query temperature) sets it
    QUERY_TEMPERATURE: ClassVar[bool] = False
    # a family whose layers are its own but run :meth:`_mlp` (every activation, MLP biases) sets it True
    SHARED_MLP: ClassVar[bool] = False
    LAYER_NORM: ClassVar[bool] = False  # its layers take ModelConfig.layer_norm's LayerNorms
    # a family whose layers rotate its local_rope_layers themselves sets it True; the others' layers rotate them
    # with the shared :meth:`_rotate` (``ModelConfig.local_rope_theta``'s plain rope, :mod:`typed_ropes`)
    OWN_LOCAL_ROPE: ClassVar[bool] = False

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu", quantized: dict[str, GroupQuantized] | None = None,
                 int4_max_rows: int = 0, deterministic: bool = False, fused_ops: bool = True,
                 flashinfer_module: ModuleType | None = None, grouped_experts: bool | None = None):
        if config.query_temperature_beta and (type(self).final_hidden is not DecoderModel.final_hidden
                                              or (type(self)._attention is not DecoderModel._attention
                                                  and not type(self).QUERY_TEMPERATURE)):
            raise ModelLoadError(f"{config.architecture}: its decoder has no query temperature "
                                 "(llama_4_scaling_beta); only the shared and the latent decoders' layers apply it")
        if (config.mlp_activation != "swiglu" or config.mlp_bias) and not type(self).SHARED_MLP and (
                type(self).final_hidden is not DecoderModel.final_hidden or type(self)._mlp is not DecoderModel._mlp):
            raise ModelLoadError(f"{config.architecture}: its decoder's layers are its own; mlp_activation "
                                 f"{config.mlp_activation!r} (mlp_bias {config.mlp_bias}) runs in the shared "
                                 "decoder's MLP only")
        if config.layer_norm and not type(self).LAYER_NORM:
            raise ModelLoadError(f"{config.architecture}: LayerNorm layers run in LayerNormDecoderModel only")
        self.config = config
        self.deterministic = deterministic
        self._row_block = INVARIANT_ROW_BLOCK if deterministic else 0
        if deterministic and int4_max_rows > 0:
            int4_max_rows = INT4_ALL_ROWS
        self.dtype = dtype
        self.device = torch.device(device)
        usable = bool(quantized) and int4_max_rows > 0 and int4_supported(self.device, dtype)
        self._quantized = quantized if usable else {}
        self.int4_max_rows = int4_max_rows if usable else 0
        self.grouped_experts = config.moe is not None and _grouped_experts(grouped_experts, self.device, dtype,
                                                                          deterministic)
        self._source = source = WeightSource(tensors, dtype, self.device)
        cfg = config
        self.embed = source.take("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))
        self.final_norm = source.take("model.norm.weight", (cfg.hidden_size,))
        # deterministic: the head's rows on AMX where the CPU has it (row-invariant at any count, faster than
        # oneDNN's 32-row blocks at 1-16 rows here)
        rows = cfg.output_vocab_size or cfg.vocab_size
        head = self.embed if cfg.tie_word_embeddings else source.take("lm_head.weight", (rows, cfg.hidden_size))
        head_bias = source.take("lm_head.bias", (rows,)) if cfg.lm_head_bias else None
        self.lm_head = prepare_linear(head, bias=head_bias, row_block=self._row_block, prompt_rows=deterministic)
        self.layers = [self._layer(i) for i in range(cfg.num_layers)]
        self._model_weights()
        self._kv_index = {layer: n for n, layer in enumerate(cfg.kv_layers)}  # layer -> its KV cache (a hybrid's)
        source.check_all_taken()
        del self._source, self._quantized
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_length, cfg.rope_theta, self.device, cfg.rope_scaling,
                                    cfg.rotary_dim, interleaved=cfg.rope_interleaved)
        multipliers = cfg.multipliers
        self.scale = cfg.head_dim**-0.5 if multipliers is None or multipliers.attention is None \
            else multipliers.attention
        self.ops = choose_fused_ops(cfg, self.rope, dtype, self.device, enabled=fused_ops and self.FUSED_OPS,
                                    deterministic=deterministic,
                                    flashinfer_module=flashinfer_module)
        if cfg.rope_in_float32 and type(self.ops.rope) is TorchRope and dtype != torch.float32:
            self.ops = dataclasses.replace(self.ops, rope=Float32Rope(self.rope))  # (FlashInfer's computes so)
        if cfg.local_rope_layers and not self.OWN_LOCAL_ROPE:
            local = local_rope(cfg, self.device, dtype)
            if local is None:
                raise ModelLoadError(f"{cfg.architecture}: local rope layers {cfg.local_rope_layers} without a "
                                     "local_rope_theta")
            self.ops = dataclasses.replace(self.ops, rope=TypedRopes(self.ops.rope, local))

    def _model_weights(self) -> None:
        """Model-level weights a family adds (beside the embedding, final norm and head), taken before the loader
        checks that every tensor was read."""

    def _projection(self, parts: list[tuple[str, tuple[int, int]]], bias: bool = False,
                    by_row_kind: bool = True) -> LinearWeight:
        """The fused projection of ``parts`` (stacked along output rows), with its 4-bit form when every
        part has one (the codes are packed, not kept), and its fused bias. ``by_row_kind``: :meth:`forward`
        runs it with the step's ``paths`` (not the experts of a sparse layer)."""
        take = self._source.take
        names = [name for name, _ in parts]
        dense = torch.cat([take(n, s) for n, s in parts]) if len(parts) > 1 else take(*parts[0])
        fused_bias = None
        if bias:
            biases = [take(n.removesuffix(".weight") + ".bias", (s[0],)) for n, s in parts]
            fused_bias = torch.cat(biases) if len(biases) > 1 else biases[0]
        if not all(name in self._quantized for name in names):
            return prepare_linear(dense, bias=fused_bias, row_block=self._row_block, prompt_rows=by_row_kind)
        codes = GroupQuantized.cat([self._quantized[name] for name in names])
        return prepare_linear(dense, int4=codes, int4_max_rows=self.int4_max_rows, bias=fused_bias,
                              row_block=self._row_block, prompt_rows=by_row_kind)

    def _qkv_parts(self, a: str) -> list[tuple[str, tuple[int, int]]]:
        """The checkpoint tensors (name, shape) of a layer's q, k and v rows, in that order (``a``: the
        attention's prefix): one ``qkv_proj`` where the checkpoint stores them fused (Phi-3's; Sarvam-MoE's
        ``query_key_value``, renamed)."""
        cfg, hidden = self.config, self.config.hidden_size
        if self._source.has(a + "qkv_proj.weight"):
            return [(a + "qkv_proj.weight", (cfg.q_size + 2 * cfg.kv_size, hidden))]
        return [(a + "q_proj.weight", (cfg.q_size, hidden)), (a + "k_proj.weight", (cfg.kv_size, hidden)),
                (a + "v_proj.weight", (cfg.kv_size, hidden))]

    def _gate_up_parts(self, p: str) -> list[tuple[str, tuple[int, int]]]:
        """The checkpoint tensors of a dense MLP's gate rows, then its up rows (``p``: the layer's prefix): one
        ``gate_up_proj`` where the checkpoint stores them fused (GLM-4's, Phi-3's)."""
        inter, hidden = self.config.intermediate_size, self.config.hidden_size
        if self._source.has(p + "mlp.gate_up_proj.weight"):
            return [(p + "mlp.gate_up_proj.weight", (2 * inter, hidden))]
        return [(p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden))]

    def _layer(self, i: int) -> LayerWeights:
        cfg, take, p = self.config, self._source.take, f"model.layers.{i}."
        hidden, a = cfg.hidden_size, p + "self_attn."
        qkv = self._projection(self._qkv_parts(a), bias=cfg.qkv_bias)
        layer = LayerWeights(
            input_norm=take(p + "input_layernorm.weight", (hidden,)),
            qkv=qkv,
            o=self._projection([(a + "o_proj.weight", (hidden, cfg.q_size))], bias=cfg.o_bias),
            post_norm=None if cfg.parallel_blocks and not cfg.parallel_mlp_norm  # type: ignore[arg-type]  (one norm)
            else take(p + "post_attention_layernorm.weight", (hidden,)),
            gate_up=None, down=None,
        )
        if cfg.qk_norm:
            layer.q_norm = take(a + "q_norm.weight", (cfg.q_size if cfg.qk_norm_whole else cfg.head_dim,))
            layer.k_norm = take(a + "k_norm.weight", (cfg.kv_size if cfg.qk_norm_whole else cfg.head_dim,))
        if cfg.sandwich_norms:
            layer.attn_out_norm = take(p + "post_self_attn_layernorm.weight", (hidden,))
            layer.mlp_out_norm = take(p + "post_mlp_layernorm.weight", (hidden,))
        if cfg.attention_sinks:  # GPT-OSS's, Granite SWA's: a learned logit per head, in float32
            layer.sinks = take(a + "sinks", (cfg.num_heads,)).float()
        if cfg.attention_head_gate or cfg.attention_value_gate:
            rows = cfg.q_size if cfg.attention_value_gate else cfg.num_heads
            layer.output_gate = self._projection([(a + "g_proj.weight", (rows, hidden))])
        return self._with_mlp(layer, i)

    def _with_mlp(self, layer: LayerWeights, i: int) -> LayerWeights:
        """``layer`` with layer ``i``'s MLP weights: its experts where it is sparse, else its dense MLP (an ungated
        one's up projection as ``gate_up``)."""
        cfg, p = self.config, f"model.layers.{i}."
        out_norm = p + "post_mlp_layernorm.weight"
        if cfg.is_sparse_layer(i):
            layer.moe = self._experts(p + "mlp.")
            if cfg.moe is not None and cfg.moe.output_norm:
                layer.mlp_out_norm = self._source.take(out_norm, (cfg.hidden_size,))
            return layer
        if cfg.moe is not None and cfg.moe.output_norm:
            self._source.skip(out_norm)  # A.X-K1's dense layers store one they do not use
        if cfg.mlp_activation == "swiglu":
            layer.gate_up = self._projection(self._gate_up_parts(p), bias=cfg.mlp_bias)
        else:
            layer.gate_up = self._projection([(p + "mlp.up_proj.weight", (cfg.intermediate_size, cfg.hidden_size))],
                                             bias=cfg.mlp_bias)
        layer.down = self._projection([(p + "mlp.down_proj.weight", (cfg.hidden_size, cfg.intermediate_size))],
                                      bias=cfg.mlp_bias)
        if cfg.mlp_activation == "xielu":
            layer.xielu = XIELUParameters.take(self._source, p + "mlp.act_fn.")
        return layer

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                states: RecurrentStates | None = None) -> torch.Tensor:
        """Run one step over the concatenated new tokens of a batch (attention already planned).

        ``paths``: the path of each row through the projections that have a 4-bit form (the deterministic
        mode; None: by the step's row count). The experts of a sparse layer and the LM head ignore it.
        ``states``: a hybrid model's recurrent states (:meth:`final_hidden`).
        Returns float32 logits ``[len(logits_indices), vocab]`` for the token positions that sample.
        """
        return self.logits(self.final_hidden(input_ids, positions, kv_caches, attention, logits_indices, paths,
                                             states))

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        """The float32 logits ``[n, vocab]`` of final hidden rows ``[n, hidden]`` (:meth:`final_hidden`); a
        caller with many rows (a prompt's logprobs) takes them a slice at a time, bounding the ``[n, vocab]``."""
        scalars = self.config.multipliers
        if scalars is not None and scalars.head_input_divisor != 1.0:  # MiniCPM3's
            rows = rows / scalars.head_input_divisor
        logits = linear(rows, self.lm_head).float()
        if scalars is not None and scalars.logits_scale != 1.0:  # Cohere's
            logits = logits * scalars.logits_scale
        if scalars is not None and scalars.logits_divisor != 1.0:
            logits = logits / scalars.logits_divisor
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        if self.config.output_vocab_size is not None:  # a pruned head: the ids past it are never sampled
            logits = F.pad(logits, (0, self.config.vocab_size - logits.shape[-1]), value=float("-inf"))
        return logits

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`forward` up to the LM head: the final-normed hidden rows ``[len(logits_indices), hidden]``
        (``states``: a hybrid model's recurrent states, planned for this step; the runner's, as ``kv_caches`` are)."""
        cfg, ops, eps = self.config, self.ops, self.config.rms_norm_eps
        # the residual stream, and what the last block adds to it (added where the next norm reads it: one
        # fused kernel on the FlashInfer path, which writes both in place)
        hidden, delta = self._embed(input_ids), None
        scalars = cfg.multipliers
        residual = 1.0 if scalars is None else scalars.residual
        rope = ops.rope.prepare(positions)
        query_scale = self._query_scale(positions, hidden.dtype)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x, hidden = ops.add_rms_norm(delta, hidden, layer.input_norm, eps)
            o = self._attention(i, layer, x, kv_cache, attention, rope, paths, query_scale)
            if layer.attn_out_norm is not None:
                o = rms_norm(o, layer.attn_out_norm, eps)
            x, hidden = ops.add_rms_norm(o if residual == 1.0 else o * residual, hidden, layer.post_norm, eps)
            delta = self._mlp(x, layer, paths)
            if layer.mlp_out_norm is not None:
                delta = rms_norm(delta, layer.mlp_out_norm, eps)
            if residual != 1.0:
                delta = delta * residual
        return ops.final_rms_norm(delta, hidden, self.final_norm, eps, logits_indices)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The residual stream's start: the tokens' embeddings (times Granite's embedding multiplier)."""
        hidden = F.embedding(input_ids, self.embed)
        scalars = self.config.multipliers
        return hidden if scalars is None or scalars.embedding == 1.0 else hidden * scalars.embedding

    def _query_scale(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """The step's query multipliers ``[T, 1, 1]`` that :meth:`_attention` takes (:func:`query_temperature`'s; a
        family with a temperature of its own gives its own), None for none."""
        return query_temperature(self.config, positions, dtype)

    def _attention(self, i: int, layer: LayerWeights, x: torch.Tensor, kv_cache: torch.Tensor,
                   attention: AttentionBackend, rope: object, paths: RowPaths | None,
                   query_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``i``'s attention block on its normed input ``x [T, hidden]``, through the output projection
        (``rope``: the step's ``ops.rope.prepare``; ``query_scale``: :func:`query_temperature`'s ``[T, 1, 1]``)."""
        cfg, eps, num_tokens = self.config, self.config.rms_norm_eps, x.shape[0]
        qkv = linear(x, layer.qkv, paths)
        if cfg.clip_qkv is not None:  # OLMo 1.7's
            qkv = qkv.clamp(-cfg.clip_qkv, cfg.clip_qkv)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        if layer.q_norm is not None and cfg.qk_norm_whole:
            q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
        q = q.view(num_tokens, cfg.num_heads, cfg.head_dim)
        k = k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        if layer.q_norm is not None and not cfg.qk_norm_whole and not cfg.qk_norm_after_rope:
            q, k = self._head_norms(q, k, layer)
        if i not in cfg.nope_layers:  # SmolLM3's NoPE layers attend unrotated
            q, k = self._rotate(i, q, k, rope)
        if layer.q_norm is not None and cfg.qk_norm_after_rope:  # Hunyuan's
            q, k = self._head_norms(q, k, layer)
        if query_scale is not None:
            q = q * query_scale
        v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        attn = attention.forward(q, k, v, kv_cache, self.scale, **attention_options(cfg, i, layer.sinks))
        if layer.output_gate is not None:  # from the layer's normed input: a gate per head (LFM3's) or per value
            gate = torch.sigmoid(linear(x, layer.output_gate, paths))
            attn = attn.view(num_tokens, cfg.num_heads, cfg.head_dim) * \
                gate.view(num_tokens, cfg.num_heads, -1)
        return linear(attn.reshape(num_tokens, cfg.q_size), layer.o, paths)

    def _rotate(self, i: int, q: torch.Tensor, k: torch.Tensor, rope: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s q and k rotated (``rope``: what :meth:`final_hidden` prepared for the step), a local rope
        layer's with its own rope (:class:`TypedRopes`); a family whose layers rotate differently gives its own."""
        if isinstance(self.ops.rope, TypedRopes):
            return self.ops.rope.rotate(i in self.config.local_rope_layers, q, k, rope)  # type: ignore[arg-type]
        return self.ops.rope(q, k, rope)

    def _head_norms(self, q: torch.Tensor, k: torch.Tensor, layer: LayerWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [T, heads, head_dim]`` and ``k`` normed head by head (Qwen3's RMSNorm, one weight for every head; a
        family with norms of its own gives its own)."""
        eps = self.config.rms_norm_eps
        return rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights, paths: RowPaths | None) -> torch.Tensor:
        if layer.moe is not None:
            return moe_forward(x, layer.moe, self.config.moe, self.ops.silu_and_mul)
        up = linear(x, layer.gate_up, paths)
        if layer.xielu is not None:
            return linear(layer.xielu(up), layer.down, paths)
        if self.config.mlp_activation == "relu2":
            return linear(torch.relu(up).square(), layer.down, paths)
        if self.config.mlp_activation == "gelu_tanh":
            return linear(F.gelu(up, approximate="tanh"), layer.down, paths)
        if self.config.mlp_activation == "gelu":
            return linear(F.gelu(up), layer.down, paths)
        return linear(self.ops.silu_and_mul(up), layer.down, paths)


@dataclass
class XIELUParameters:
    """A layer's xIELU (Apertus): ``alpha_p * x² + beta * x`` where ``x > 0``, else
    ``(expm1(min(x, eps)) - x) * alpha_n + beta * x``, with ``alpha_p = softplus(a_p)`` and
    ``alpha_n = beta + softplus(a_n)`` of the layer's learned ``a_p``, ``a_n`` (transformers' ``XIELUActivation``)."""

    alpha_p: torch.Tensor
    alpha_n: torch.Tensor
    beta: torch.Tensor
    eps: torch.Tensor

    @staticmethod
    def take(source: WeightSource, prefix: str) -> XIELUParameters:
        a_p, a_n = source.take(prefix + "alpha_p", (1,)), source.take(prefix + "alpha_n", (1,))
        beta, eps = source.take(prefix + "beta", ()), source.take(prefix + "eps", ())
        return XIELUParameters(F.softplus(a_p), beta + F.softplus(a_n), beta, eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, self.alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.minimum(x, self.eps)) - x) * self.alpha_n + self.beta * x)


def local_rope(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> TorchRope | None:
    """The plain rope of ``config.local_rope_theta`` that its ``local_rope_layers`` rotate with (OLMo 3's, LFM3's and
    MiMo-V2-Flash's sliding layers; over the full layers' ``rotary_dim``), in the model dtype; None without one."""
    if config.local_rope_theta is None:
        return None
    rope = RotaryEmbedding(config.head_dim, config.rope_length, config.local_rope_theta, device,
                           rotary_dim=config.rotary_dim)
    return Float32Rope(rope) if config.rope_in_float32 and dtype != torch.float32 else TorchRope(rope, dtype)


def query_temperature(config: ModelConfig, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """Each query's multiplier ``[T, 1, 1]`` in ``dtype`` (``ModelConfig.query_temperature_beta``), computed in
    float32 as transformers does; None for a model without one."""
    if not config.query_temperature_beta:
        return None
    periods = torch.floor(positions / config.query_temperature_period)  # true division: float32
    return (1 + config.query_temperature_beta * torch.log(1 + periods)).to(dtype)[:, None, None]


def attention_options(config: ModelConfig, layer: int, sinks: torch.Tensor | None = None) -> dict[str, object]:
    """Layer ``layer``'s options to the backend's ``forward``: only those it has (a backend without windows,
    sinks or a softcap takes none of those keywords, and is never chosen for a model that has them; a chunked
    layer's ``chunk`` goes to :class:`~kernels.attention.chunked.ChunkedAttention`, which the model runner builds
    for a model with chunked layers)."""
    options: dict[str, object] = {}
    window = config.window(layer)
    if window is not None:
        options["window"] = window
    chunk = config.chunk(layer)
    if chunk is not None:
        options["chunk"] = chunk
    if sinks is not None:
        options["sinks"] = sinks
    if config.attn_logit_softcap is not None:
        options["softcap"] = config.attn_logit_softcap
    return options


def _grouped_experts(wanted: bool | None, device: torch.device, dtype: torch.dtype, deterministic: bool) -> bool:
    """Whether a MoE model's experts run as grouped GEMMs (see :class:`DecoderModel`)."""
    if wanted is not None:
        return wanted
    if device.type != "cuda" or deterministic:
        return False
    problem = grouped_experts_problem(device, dtype)
    if problem:
        log.warning("moe: experts run one by one (a host sync per sparse layer; decode not captured)", why=problem)
    return not problem


def check_vocabulary(config: ModelConfig, tokenizer_size: int) -> None:
    """A tokenizer whose ids run past the embedding would index out of it: refused at load."""
    if tokenizer_size > config.vocab_size:
        raise ModelLoadError(f"the tokenizer has {tokenizer_size} tokens but the embedding only "
                             f"{config.vocab_size} rows: tokenizer and weights are of different models")
