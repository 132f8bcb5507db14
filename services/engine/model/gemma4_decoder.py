"""Gemma 4's decoder over the shared weights machinery (:class:`DecoderModel`), computed as transformers'
``Gemma4TextModel`` computes it.

Per layer: ``h += post_attn_norm(attention(input_norm(h)))``; then ``m = mlp(pre_ff_norm(h))`` (GELU-tanh gated),
with experts beside it ``m = post_ff_norm_1(m) + post_ff_norm_2(experts(pre_ff_norm_2(h)))`` routed from ``h``;
``h += post_ff_norm(m)``; with per-layer inputs ``h += post_ple_norm(proj(gelu(gate(h)) * ple[layer]))``; and last
``h *= layer_scalar``. Norms are RMSNorm computed in float32 with their weight as stored (not Gemma 3's ``1 + w``);
the values' norm has no weight. Queries and keys are normed per head and rotated with their layer's rope; scores are
not scaled. A layer's KV heads are written into the cache's slot in copies (:mod:`gemma4_config`); a KV-sharing layer
attends over its source's KV, handing the backend the rows the source wrote this step again (the same values in the
same places). Embeddings are scaled by ``sqrt(hidden)`` rounded to the serving dtype; the logits may be softcapped.

Per-layer inputs (PLE, the E2B/E4B models): each token's row of a second embedding (``L × P`` wide, times
``sqrt(P)``) plus a normed projection of its embedding, both ``[L, P]``, summed and scaled by ``1 / sqrt(2)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.linear import LinearWeight, RowPaths, linear, prepare_linear
from kernels.rope import RotaryEmbedding
from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, attention_options
from services.engine.model.moe import MoEWeights, experts_forward

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.model.gemma4_config import Gemma4Config
    from services.engine.recurrent_states import RecurrentStates


def gemma4_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """transformers' ``Gemma4RMSNorm``: ``x * (mean(x^2) + eps) ** -0.5`` (times ``weight``) in float32, returned in
    ``x.dtype``."""
    y = x.float()
    y = y * torch.pow(y.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (y if weight is None else y * weight.float()).to(x.dtype)


def gelu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` of rows ``[gate | up]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


@dataclass
class Gemma4Experts:
    router: LinearWeight  # [experts, hidden]
    router_scale: torch.Tensor  # [hidden]: the router's input scale (times hidden ** -0.5)
    expert_scale: torch.Tensor  # [experts]: each expert's weight multiplier
    experts: MoEWeights
    pre_norm: torch.Tensor  # pre_feedforward_layernorm_2
    post_norm: torch.Tensor  # post_feedforward_layernorm_2
    mlp_post_norm: torch.Tensor  # post_feedforward_layernorm_1: the dense MLP's output norm


@dataclass
class Gemma4LayerWeights:
    input_norm: torch.Tensor
    qkv: LinearWeight  # q rows, then (a KV-keeping layer's) k rows and v rows (not where the values are the keys)
    q_norm: torch.Tensor
    k_norm: torch.Tensor | None  # None: a KV-sharing layer
    o: LinearWeight
    post_attn_norm: torch.Tensor
    pre_ff_norm: torch.Tensor
    post_ff_norm: torch.Tensor
    gate_up: LinearWeight
    down: LinearWeight
    layer_scalar: torch.Tensor  # [1]
    experts: Gemma4Experts | None = None
    ple_gate: LinearWeight | None = None  # [P, hidden]
    ple_projection: LinearWeight | None = None  # [hidden, P]
    ple_norm: torch.Tensor | None = None


class Gemma4DecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a Gemma 4 checkpoint (``config.gemma4`` set); same constructor, except that the
    fused elementwise kernels are never used."""

    FUSED_OPS = False
    OWN_LOCAL_ROPE = True  # its sliding layers rotate in its own layer

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        assert config.gemma4 is not None, "Gemma4DecoderModel needs a Gemma 4 config"
        if dtype == torch.float16:  # as Gemma 2 and 3: its activations overflow float16
            raise ModelLoadError(f"{config.architecture} is not served in float16 (its activations overflow it); "
                                 "use bfloat16 or float32")
        self.g: Gemma4Config = config.gemma4
        self._shared_sources = {config.gemma4.kv_sources[i] for i in config.gemma4.shared_layers}
        super().__init__(config, tensors, dtype, *args, **kwargs)
        cfg = config
        full = next(i for i in range(cfg.num_layers) if i not in cfg.local_rope_layers)
        full_dim = self.g.layer_heads[full][1]
        if full_dim != cfg.head_dim:  # the shared decoder's rope is the slot's width; the full layers' is theirs
            self.rope = RotaryEmbedding(full_dim, cfg.rope_length, cfg.rope_theta, self.device, cfg.rope_scaling)
        local = [self.g.layer_heads[i][1] for i in cfg.local_rope_layers]
        assert cfg.local_rope_theta is not None
        self.local_rope = None if not local else RotaryEmbedding(local[0], cfg.rope_length, cfg.local_rope_theta,
                                                                 self.device)
        self.scale = 1.0
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=dtype, device=self.device)

    def _layer(self, i: int) -> Gemma4LayerWeights:  # type: ignore[override]
        cfg, g, take = self.config, self.g, self._source.take
        p, a, hidden = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", cfg.hidden_size
        kv_heads, dim = g.layer_heads[i]
        owner = g.kv_sources[i] == i
        parts = [(a + "q_proj.weight", (cfg.num_heads * dim, hidden))]
        if owner:
            parts.append((a + "k_proj.weight", (kv_heads * dim, hidden)))
            if i not in g.value_is_key:
                parts.append((a + "v_proj.weight", (kv_heads * dim, hidden)))
        else:  # transformers ignores a sharing layer's own k/v weights where a file has them
            for name in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
                self._source.skip(a + name)
        inter = cfg.intermediate_size * (2 if i in g.double_wide_layers else 1)
        layer = Gemma4LayerWeights(
            input_norm=take(p + "input_layernorm.weight", (hidden,)),
            qkv=self._projection(parts),
            q_norm=take(a + "q_norm.weight", (dim,)),
            k_norm=take(a + "k_norm.weight", (dim,)) if owner else None,
            o=self._projection([(a + "o_proj.weight", (hidden, cfg.num_heads * dim))]),
            post_attn_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
            pre_ff_norm=take(p + "pre_feedforward_layernorm.weight", (hidden,)),
            post_ff_norm=take(p + "post_feedforward_layernorm.weight", (hidden,)),
            gate_up=self._projection([(p + "mlp.gate_proj.weight", (inter, hidden)),
                                      (p + "mlp.up_proj.weight", (inter, hidden))]),
            down=self._projection([(p + "mlp.down_proj.weight", (hidden, inter))]),
            layer_scalar=take(p + "layer_scalar", (1,)),
        )
        if g.moe_beside_mlp:
            layer.experts = self._gemma4_experts(p)
        if g.per_layer_input_size:
            ple = g.per_layer_input_size
            layer.ple_gate = self._projection([(p + "per_layer_input_gate.weight", (ple, hidden))])
            layer.ple_projection = self._projection([(p + "per_layer_projection.weight", (hidden, ple))])
            layer.ple_norm = take(p + "post_per_layer_input_norm.weight", (hidden,))
        return layer

    def _gemma4_experts(self, p: str) -> Gemma4Experts:
        moe, take, hidden = self.config.moe, self._source.take, self.config.hidden_size
        assert moe is not None
        router = prepare_linear(take(p + "router.proj.weight", (moe.num_experts, hidden)), row_block=self._row_block)
        experts = self._expert_weights(p, router)
        return Gemma4Experts(
            router=router, router_scale=take(p + "router.scale", (hidden,)),
            expert_scale=take(p + "router.per_expert_scale", (moe.num_experts,)), experts=experts,
            pre_norm=take(p + "pre_feedforward_layernorm_2.weight", (hidden,)),
            post_norm=take(p + "post_feedforward_layernorm_2.weight", (hidden,)),
            mlp_post_norm=take(p + "post_feedforward_layernorm_1.weight", (hidden,)))

    def _model_weights(self) -> None:
        """The per-layer inputs' model-level weights."""
        cfg, ple, take = self.config, self.g.per_layer_input_size, self._source.take
        self.ple_embed = self.ple_model_projection = self.ple_model_norm = None
        if not ple:
            return
        width = cfg.num_layers * ple
        name = "model.embed_tokens_per_layer.weight"
        rows = self._source.tensors[name].shape[0] if self._source.has(name) else cfg.vocab_size
        if rows < cfg.vocab_size:
            raise ModelLoadError(f"{name} has {rows} rows, fewer than the {cfg.vocab_size} tokens")
        self.ple_embed = take(name, (rows, width))
        self.ple_embed_scale = torch.tensor(ple**0.5, dtype=self.dtype, device=self.device)
        self.ple_model_projection = self._projection([("model.per_layer_model_projection.weight", (width,
                                                                                                    cfg.hidden_size))])
        self.ple_model_norm = take("model.per_layer_projection_norm.weight", (ple,))

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`DecoderModel.logits`, softcapped where the model says so."""
        logits = super().logits(rows)
        cap = self.g.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the KV-keeping layers'), computed as the
        module says."""
        eps = self.config.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed) * self.embed_scale
        per_layer = self._per_layer_inputs(input_ids, hidden, paths)
        tables = {False: self.rope.tables(positions, self.dtype)}
        if self.local_rope is not None:
            tables[True] = self.local_rope.tables(positions, self.dtype)
        # a source layer -> the KV rows it wrote this step (kept only for the layers a later one shares)
        written: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Gemma4LayerWeights)
            x = gemma4_norm(hidden, layer.input_norm, eps)
            o = self._gemma4_attention(i, layer, x, kv_caches, attention, tables, written, paths)
            hidden = hidden + gemma4_norm(o, layer.post_attn_norm, eps)
            x = gemma4_norm(hidden, layer.pre_ff_norm, eps)
            mlp = linear(gelu_and_mul(linear(x, layer.gate_up, paths)), layer.down, paths)
            if layer.experts is not None:
                mlp = gemma4_norm(mlp, layer.experts.mlp_post_norm, eps) + self._experts_out(hidden, layer.experts)
            hidden = hidden + gemma4_norm(mlp, layer.post_ff_norm, eps)
            if per_layer is not None:
                assert layer.ple_gate is not None and layer.ple_projection is not None
                gated = F.gelu(linear(hidden, layer.ple_gate, paths), approximate="tanh") * per_layer[:, i]
                hidden = hidden + gemma4_norm(linear(gated, layer.ple_projection, paths), layer.ple_norm, eps)
            hidden = hidden * layer.layer_scalar
        return gemma4_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

    def _per_layer_inputs(self, input_ids: torch.Tensor, embedded: torch.Tensor,
                          paths: RowPaths | None) -> torch.Tensor | None:
        """Each token's per-layer inputs ``[T, L, P]`` (see the module), None for a model without them."""
        ple = self.g.per_layer_input_size
        if not ple:
            return None
        shape = (input_ids.shape[0], self.config.num_layers, ple)
        token = (F.embedding(input_ids, self.ple_embed) * self.ple_embed_scale).view(shape)
        projected = linear(embedded, self.ple_model_projection, paths) * self.config.hidden_size**-0.5
        projected = gemma4_norm(projected.view(shape), self.ple_model_norm, self.config.rms_norm_eps)
        return (projected + token) * 2.0**-0.5

    def _gemma4_attention(self, i: int, layer: Gemma4LayerWeights, x: torch.Tensor, kv_caches: list[torch.Tensor],
                          attention: AttentionBackend, tables: dict[bool, tuple[torch.Tensor, torch.Tensor]],
                          written: dict[int, tuple[torch.Tensor, torch.Tensor]],
                          paths: RowPaths | None) -> torch.Tensor:
        cfg, g, eps, num_tokens = self.config, self.g, self.config.rms_norm_eps, x.shape[0]
        kv_heads, dim = g.layer_heads[i]
        source = g.kv_sources[i]
        local = i in cfg.local_rope_layers
        cos, sin = tables[local]
        rope = self.local_rope if local else self.rope
        assert rope is not None
        qkv = linear(x, layer.qkv, paths)
        q = gemma4_norm(qkv[:, :cfg.num_heads * dim].view(num_tokens, cfg.num_heads, dim), layer.q_norm, eps)
        q = rope.rotate(q, cos, sin)
        if source == i:
            kv = qkv[:, cfg.num_heads * dim:].view(num_tokens, -1, kv_heads, dim)
            raw_k, raw_v = kv[:, 0], kv[:, 0] if i in g.value_is_key else kv[:, 1]
            k = rope.rotate(gemma4_norm(raw_k, layer.k_norm, eps), cos, sin)
            v = gemma4_norm(raw_v, None, eps)
            repeats = g.repeats(i, cfg.kv_size)
            if repeats > 1:
                k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
            if i in self._shared_sources:
                written[i] = (k, v)
        else:
            k, v = written[source]
        cache = kv_caches[self._kv_index[source]]
        view = cache.view(*cache.shape[:3], cfg.kv_size // dim, dim)
        attn = attention.forward(q, k, v, view, self.scale, **attention_options(cfg, i))
        return linear(attn.reshape(num_tokens, cfg.num_heads * dim), layer.o, paths)

    def _experts_out(self, hidden: torch.Tensor, experts: Gemma4Experts) -> torch.Tensor:
        """The experts' normed output for the residual stream ``hidden``, routed as transformers'
        ``Gemma4TextRouter``: a weightless norm times ``scale / sqrt(hidden)``, the top-k of a float32 softmax,
        renormalised, each times its expert's scale."""
        moe, eps = self.config.moe, self.config.rms_norm_eps
        assert moe is not None
        routed = gemma4_norm(hidden, None, eps) * experts.router_scale * self.config.hidden_size**-0.5
        probs = torch.softmax(linear(routed, experts.router), dim=-1, dtype=torch.float32)
        top_probs, top_experts = probs.topk(moe.top_k, dim=-1)
        top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
        top_probs = top_probs * experts.expert_scale[top_experts]
        out = experts_forward(gemma4_norm(hidden, experts.pre_norm, eps), experts.experts, moe, top_probs,
                              top_experts, gelu_and_mul)
        return gemma4_norm(out, experts.post_norm, eps)
