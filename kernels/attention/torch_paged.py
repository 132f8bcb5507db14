"""Pure-torch paged attention: the reference backend, and the production one on CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from kernels.attention.base import K_INDEX, V_INDEX, AttentionBackend, write_kv_rows
from kernels.attention.explicit import explicit_sdpa
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.torch_decode import DECODE_IMPLS, decode_sdpa
from kernels.attention.torch_plan import DEFAULT_GROUP_WASTE_TOKENS, DecodeGroup, PrefillSeq, StepPlan, build_plan
from kernels.attention.workspace import Workspace

DecodeImpl = Literal["auto", "sdpa", "bag"]

BAG_MIN_TOKENS = 4096
"""On CPU, decode groups gathering at least this many positions (sequences x padded length) use
``decode_bag``; smaller ones ``decode_sdpa`` (measured crossover, bf16 and fp32)."""
BAG_MAX_KV_HEADS = 4
"""``decode_bag`` scores every query head against every KV head; past this many KV heads that waste wins."""


@dataclass(frozen=True)
class _Scores:
    """What a layer does to its scores beyond torch's fused attention: sinks and a softcap (:mod:`.explicit`)."""

    sinks: torch.Tensor | None = None  # [Hq]
    softcap: float | None = None

    @property
    def explicit(self) -> bool:
        return self.sinks is not None or self.softcap is not None

    def attend(self):
        """``F.scaled_dot_product_attention``, or a call of the same form through :func:`explicit_sdpa`."""
        if not self.explicit:
            return F.scaled_dot_product_attention
        sinks = None if self.sinks is None else self.sinks.view(1, -1, 1, 1)

        def attend(query, key, value, *, attn_mask=None, is_causal=False, scale, enable_gqa=False):
            return explicit_sdpa(query, key, value, scale, sinks=sinks, softcap=self.softcap, attn_mask=attn_mask,
                                 is_causal=is_causal, enable_gqa=enable_gqa)

        return attend


NO_SCORES = _Scores()


class TorchPagedAttention(AttentionBackend):
    """Paged attention with torch ops only (CPU and CUDA).

    Decode sequences are batched into length groups (one gather + one batched attention per group);
    prefill sequences run one ``scaled_dot_product_attention`` each: ``is_causal`` when they have no
    cached prefix (their new K/V are used directly), else over their gathered blocks with a
    bottom-right causal mask built in ``plan``. With ``sinks`` or ``softcap``, the same masks and gathers go
    through :func:`~kernels.attention.explicit.explicit_sdpa` instead (decode groups never take the bag path).
    """

    name: ClassVar[str] = "torch"
    supports_window: ClassVar[bool] = True
    supports_sinks: ClassVar[bool] = True
    supports_softcap: ClassVar[bool] = True

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        decode_impl: DecodeImpl = "auto",
        group_waste_tokens: int = DEFAULT_GROUP_WASTE_TOKENS,
    ) -> None:
        if decode_impl not in ("auto", *DECODE_IMPLS):
            raise ValueError(f"decode_impl must be auto, sdpa or bag, got {decode_impl!r}")
        self.device = torch.device(device) if device is not None else None
        self.decode_impl = decode_impl
        self.group_waste_tokens = group_waste_tokens
        self._plan: StepPlan | None = None
        self._workspace = Workspace()

    def plan(self, meta: AttentionMetadata) -> None:
        self._plan = build_plan(meta, self.group_waste_tokens)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None, softcap: float | None = None,
    ) -> torch.Tensor:
        plan = self._plan
        if plan is None:
            raise RuntimeError("TorchPagedAttention.forward called before plan()")
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[3]
        if num_tokens != plan.num_tokens:
            raise ValueError(f"planned {plan.num_tokens} tokens, got q of {num_tokens}")
        if num_heads % num_kv_heads or kv_cache.shape[4] != head_dim:
            raise ValueError(f"q {list(q.shape)} does not fit kv_cache {list(kv_cache.shape)}")
        write_kv_rows(kv_cache, k, v, plan.rows)
        scores = _Scores(sinks, softcap)
        if plan.decode_only_in_order:
            return self._decode(plan.decode_groups[0], q, kv_cache, scale, window, scores)
        if not plan.decode_groups and len(plan.prefills) == 1:
            return self._prefill(plan.prefills[0], q, k, v, kv_cache, scale, window, scores).contiguous()
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        for group in plan.decode_groups:
            group_q = q.index_select(0, group.token_index)
            out.index_copy_(0, group.token_index, self._decode(group, group_q, kv_cache, scale, window, scores))
        for seq in plan.prefills:
            out[seq.token_start : seq.token_end] = self._prefill(seq, q, k, v, kv_cache, scale, window, scores)
        return out

    def _decode(self, group: DecodeGroup, q: torch.Tensor, kv_cache: torch.Tensor, scale: float,
                window: int | None, scores: _Scores = NO_SCORES) -> torch.Tensor:
        if window is not None:
            group = group.windowed(window)
        if scores.explicit:
            return decode_sdpa(group, q, kv_cache, scale, self._workspace, sinks=scores.sinks, softcap=scores.softcap)
        return DECODE_IMPLS[self._pick_decode(group, kv_cache)](group, q, kv_cache, scale, self._workspace)

    def _pick_decode(self, group: DecodeGroup, kv_cache: torch.Tensor) -> str:
        if self.decode_impl != "auto":
            return self.decode_impl
        if kv_cache.device.type != "cpu" or not kv_cache.is_contiguous():
            return "sdpa"
        if group.size * group.padded_len >= BAG_MIN_TOKENS and kv_cache.shape[3] <= BAG_MAX_KV_HEADS:
            return "bag"
        return "sdpa"

    def _prefill(
        self,
        seq: PrefillSeq,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        scale: float,
        window: int | None = None,
        scores: _Scores = NO_SCORES,
    ) -> torch.Tensor:
        """``[query_len, Hq, D]`` (possibly a strided view) for one sequence."""
        span = slice(seq.token_start, seq.token_end)
        gqa = q.shape[1] != kv_cache.shape[3]
        query = q[span].unsqueeze(0).transpose(1, 2)
        attend = scores.attend()
        windowed = seq.hides(window)
        if windowed:
            seq = seq.windowed(window, kv_cache.shape[2])
        if seq.block_index is None:
            key, value = k[span], v[span]
            out = attend(
                query,
                key.unsqueeze(0).transpose(1, 2),
                value.unsqueeze(0).transpose(1, 2),
                attn_mask=seq.additive_mask(q.dtype, window) if windowed else None,
                is_causal=not windowed,
                scale=scale,
                enable_gqa=gqa,
            )
        else:
            key = self._gather_seq(kv_cache, K_INDEX, seq, "prefill_k")
            value = self._gather_seq(kv_cache, V_INDEX, seq, "prefill_v")
            out = attend(
                query,
                key.unsqueeze(0).transpose(1, 2),
                value.unsqueeze(0).transpose(1, 2),
                attn_mask=seq.additive_mask(q.dtype, window),
                scale=scale,
                enable_gqa=gqa,
            )
        return out[0].transpose(0, 1)

    def _gather_seq(self, kv_cache: torch.Tensor, which: int, seq: PrefillSeq, name: str) -> torch.Tensor:
        """``[seq_len - offset, Hkv, D]``: K or V of the sequence's positions from ``offset``, copied out of its
        blocks."""
        assert seq.block_index is not None
        _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
        shape = (seq.block_index.numel(), block_size, num_kv_heads, head_dim)
        buffer = self._workspace.take(name, shape, kv_cache.dtype, kv_cache.device)
        torch.index_select(kv_cache[:, which], 0, seq.block_index, out=buffer)
        return buffer.view(-1, num_kv_heads, head_dim)[: seq.seq_len - seq.offset]
