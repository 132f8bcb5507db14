"""Phi-3's checkpoint layout over the shared decoder: the fused projections are taken as they are stored."""

from __future__ import annotations

from services.engine.model.decoder import DecoderModel


class Phi3DecoderModel(DecoderModel):
    """A :class:`DecoderModel` reading ``self_attn.qkv_proj`` (q, k, v rows stacked); ``mlp.gate_up_proj`` (gate
    rows, then up rows, as transformers' ``chunk(2)`` splits them) the shared decoder reads where it is stored."""

    def _qkv_parts(self, a: str) -> list[tuple[str, tuple[int, int]]]:
        cfg = self.config
        return [(a + "qkv_proj.weight", (cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size))]

