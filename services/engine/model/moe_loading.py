"""How the shared decoder takes a sparse layer's weights from a checkpoint: its router (float32 where the routing
is the sigmoid's, with its correction bias), its routed experts (per-expert tensors, or stacked ones: transformers 5's
layout, ``gate_up_proj [E, 2·inter, hidden]`` and ``down_proj [E, hidden, inter]``, or, for a family whose files
store them transposed (``MoEConfig.stacked_transposed``: Qwen3-VL-MoE's), read as transformers reads them: transposed
only where the stored shape is not the expected one; stacked for grouped GEMMs on the GPU path), and its shared
expert (Qwen2-MoE's gated one, Granite MoE's and GLM-4.5's ungated ones). Nemotron 3's experts have no gate rows
(``MoEConfig.gated_experts`` false: ``up_proj`` alone, stacked ``experts.up_proj [E, inter, width]``), and Nemotron 3
Super's work in a latent width (``MoEConfig.latent_size``: ``fc1_latent_proj``/``fc2_latent_proj`` beside them). A
mixin of
:class:`~services.engine.model.decoder.DecoderModel`, using its weight source, projections and settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels.linear import LinearWeight, prepare_linear
from services.engine.model.moe import MoEWeights, SharedExpert
from services.engine.model.moe_grouped import GroupedExperts

if TYPE_CHECKING:
    from services.engine.model.config import ModelConfig
    from services.engine.model.weight_source import WeightSource


class ExpertLoading:
    """The sparse-layer half of :class:`~services.engine.model.decoder.DecoderModel`'s loading."""

    config: ModelConfig
    grouped_experts: bool
    _source: WeightSource
    _row_block: int

    def _projection(self, parts: list[tuple[str, tuple[int, int]]], bias: bool = False,
                    by_row_kind: bool = True) -> LinearWeight:
        """The decoder's (:meth:`DecoderModel._projection`)."""
        raise NotImplementedError

    def _experts(self, p: str) -> MoEWeights:
        experts = self._routed_experts(p)
        experts.shared = self._shared_expert(p)
        moe = self.config.moe
        assert moe is not None
        name, source = p + "gate.e_score_correction_bias", self._source
        if moe.correction_bias and (source.has(name) or not moe.correction_bias_optional):
            # float32, as GLM-4.5's, DeepSeek-V3's and ERNIE 4.5's routers run
            stored = (1, moe.num_experts) if source.has(name) and source.tensors[name].dim() == 2 else \
                (moe.num_experts,)  # ERNIE's is [1, experts]
            experts.choice_bias = source.take(name, stored, torch.float32).view(moe.num_experts)
        if moe.latent_size is not None:
            hidden, latent = self.config.hidden_size, moe.latent_size
            experts.latent_in = self._projection([(p + "fc1_latent_proj.weight", (latent, hidden))], by_row_kind=False)
            experts.latent_out = self._projection([(p + "fc2_latent_proj.weight", (hidden, latent))], by_row_kind=False)
        return experts

    def _router(self, p: str) -> LinearWeight:
        moe = self.config.moe
        assert moe is not None
        dtype = torch.float32 if moe.float32_router else None
        return prepare_linear(self._source.take(p + "gate.weight", (moe.num_experts, self.config.hidden_size), dtype),
                              row_block=self._row_block)

    def _shared_expert(self, p: str) -> SharedExpert | None:
        moe, hidden = self.config.moe, self.config.hidden_size
        assert moe is not None
        inter = moe.shared_expert_intermediate_size
        if inter is None:
            return None
        s = p + "shared_expert."
        parts = self._expert_rows(s, inter, hidden)
        if self._source.has(s + "gate_up_proj.weight"):  # Granite MoE's shared MLP: gate and up rows fused
            parts = [(s + "gate_up_proj.weight", (2 * inter, hidden))]
        gate = prepare_linear(self._shared_gate(p + "shared_expert_gate.weight"), row_block=self._row_block) \
            if moe.shared_expert_gated else None
        return SharedExpert(
            gate_up=self._projection(parts, by_row_kind=False),
            down=self._projection([(s + "down_proj.weight", (hidden, inter))], by_row_kind=False), gate=gate)

    def _shared_gate(self, name: str) -> torch.Tensor:
        """The shared expert's gate ``[1, hidden]``; llama.cpp's files store it squeezed, ``[hidden]``."""
        hidden = self.config.hidden_size
        if self._source.has(name) and self._source.tensors[name].dim() == 1:
            return self._source.take(name, (hidden,)).view(1, hidden)
        return self._source.take(name, (1, hidden))

    def _routed_experts(self, p: str) -> MoEWeights:
        return self._expert_weights(p, self._router(p))

    def _expert_weights(self, p: str, router: LinearWeight) -> MoEWeights:
        """A sparse layer's experts (``p``: their parent's prefix) beside ``router``: grouped, stacked or per expert,
        as the checkpoint and the settings have them (a family whose router is its own passes it)."""
        moe, hidden = self.config.moe, self._expert_width()
        assert moe is not None
        inter, source = moe.intermediate_size, self._source
        if self.grouped_experts:
            return MoEWeights(router, [], [], grouped=self._stacked_experts(p))
        if source.has(self._stacked_name(p)):
            gate_up, down = self._stacked(p)
            return MoEWeights(router, [prepare_linear(w, row_block=self._row_block) for w in gate_up.unbind(0)],
                              [prepare_linear(w, row_block=self._row_block) for w in down.unbind(0)])
        e = p + "experts.{}."
        return MoEWeights(
            router,
            [self._projection(self._expert_rows(e.format(j), inter, hidden), by_row_kind=False)
             for j in range(moe.num_experts)],
            [self._projection([(e.format(j) + "down_proj.weight", (hidden, inter))], by_row_kind=False)
             for j in range(moe.num_experts)],
        )

    def _expert_width(self) -> int:
        """The width the routed experts take and give: the latent one where they have it, else the hidden size."""
        moe = self.config.moe
        assert moe is not None
        return moe.latent_size or self.config.hidden_size

    def _expert_rows(self, e: str, inter: int, width: int) -> list[tuple[str, tuple[int, int]]]:
        """One expert's (or the shared one's) first projection (``e``: its prefix): gate and up rows, or up rows alone
        (ungated)."""
        moe = self.config.moe
        assert moe is not None
        gate = [(e + "gate_proj.weight", (inter, width))] if moe.gated_experts else []
        return [*gate, (e + "up_proj.weight", (inter, width))]

    def _stacked_name(self, p: str) -> str:
        """The stacked experts' first projection (transformers 5's layout): ``gate_up_proj``, ungated ``up_proj``."""
        moe = self.config.moe
        assert moe is not None
        return p + ("experts.gate_up_proj" if moe.gated_experts else "experts.up_proj")

    def _stacked_experts(self, p: str) -> GroupedExperts:
        moe, hidden, take = self.config.moe, self._expert_width(), self._source.take
        assert moe is not None
        inter, e = moe.intermediate_size, p + "experts.{}."
        if self._source.has(self._stacked_name(p)):
            return GroupedExperts(*self._stacked(p))
        rows = [self._expert_rows(e.format(j), inter, hidden) for j in range(moe.num_experts)]
        gate_up = torch.stack([torch.cat([take(name, shape) for name, shape in expert]) for expert in rows])
        down = torch.stack([take(e.format(j) + "down_proj.weight", (hidden, inter)) for j in range(moe.num_experts)])
        return GroupedExperts(gate_up, down)

    def _stacked(self, p: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A sparse layer's stacked ``gate_up_proj`` and ``down_proj`` in transformers 5's layout; with
        ``MoEConfig.stacked_transposed``, each is read transposed where it is stored so (its last two dims swapped), as
        transformers' loader reads such checkpoints (only a tensor whose stored shape is not the expected one); with
        ``MoEConfig.stacked_input_major`` (Llama 4's), each is always read transposed."""
        moe, hidden = self.config.moe, self._expert_width()
        assert moe is not None
        inter = moe.intermediate_size
        rows = 2 * inter if moe.gated_experts else inter
        return (self._maybe_transposed(self._stacked_name(p), (moe.num_experts, rows, hidden)),
                self._maybe_transposed(p + "experts.down_proj", (moe.num_experts, hidden, inter)))

    def _maybe_transposed(self, name: str, shape: tuple[int, int, int]) -> torch.Tensor:
        source, moe = self._source, self.config.moe
        assert moe is not None
        if moe.stacked_input_major:
            return source.take(name, (shape[0], shape[2], shape[1])).transpose(1, 2).contiguous()
        stored = tuple(source.tensors[name].shape) if source.has(name) else shape
        if moe.stacked_transposed and stored != shape and stored == (shape[0], shape[2], shape[1]):
            return source.take(name, stored).transpose(1, 2).contiguous()
        return source.take(name, shape)
