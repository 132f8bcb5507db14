"""CPU paged attention whose decode rows run a native C kernel (``native/paged_decode.c``) that reads K
and V straight from the paged cache (with a layer's window, sinks and softcap); everything else goes to the
pure-torch reference backend."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import ClassVar

import torch

from kernels.attention.base import AttentionBackend, kv_rows
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.native.build import NativeBuildError, load_library
from kernels.attention.registry import BackendUnavailableError
from kernels.attention.torch_paged import TorchPagedAttention

NATIVE_DTYPES = (torch.bfloat16, torch.float32)


@dataclass
class DecodePlan:
    """The decode sequences of a step, as the C kernel takes them."""

    token_index: torch.Tensor | None
    """``[n]`` positions of the decode tokens among the step's tokens; None when they are all of them."""
    rows: torch.Tensor
    """``[n]`` int64 K rows of the decode tokens' slots (see ``kernels.attention.base.kv_rows``)."""
    block_tables: torch.Tensor
    """``[n, max_blocks]`` int32, contiguous."""
    seq_lens: torch.Tensor
    """``[n]`` int32."""
    highest_block: int
    """The largest block id the kernel reads or writes: checked against the cache before each call,
    since C does not bound-check."""


@dataclass(frozen=True)
class LayerOptions:
    """A layer's options to ``forward`` (see :class:`~kernels.attention.base.AttentionBackend`); None: none."""

    window: int | None = None
    sinks: torch.Tensor | None = None
    softcap: float | None = None

    def keywords(self) -> dict[str, object]:
        """The options that are set, as ``forward``'s keywords."""
        return {name: value for name, value in (("window", self.window), ("sinks", self.sinks),
                                                ("softcap", self.softcap)) if value is not None}


@dataclass
class NativeStepPlan:
    meta: AttentionMetadata
    decode: DecodePlan | None
    prefill_meta: AttentionMetadata | None
    """The step's prefill sequences alone, for the torch backend."""
    prefill_index: torch.Tensor | None
    """``[m]`` positions of the prefill tokens among the step's tokens."""


def _library() -> ctypes.CDLL:
    try:
        library = load_library()
    except NativeBuildError as exc:
        raise BackendUnavailableError(f"attention backend 'cpu_native' is unavailable: {exc}") from exc
    pointer, c_int = ctypes.c_void_p, ctypes.c_int
    for function in (library.paged_decode_bf16, library.paged_decode_f32):
        function.argtypes = [pointer] * 7 + [c_int] * 6 + [ctypes.c_float, pointer, c_int, c_int, pointer,
                                                            ctypes.c_float, c_int]
        function.restype = c_int
    library.paged_decode_supports.argtypes = [c_int] * 4
    library.paged_decode_supports.restype = c_int
    for function in (library.prefill_fixed_bf16, library.prefill_fixed_f32):
        function.argtypes = [pointer] * 5 + [c_int] * 6 + [ctypes.c_float, pointer, c_int]
        function.restype = c_int
    library.prefill_fixed_supports.argtypes = [c_int] * 4
    library.prefill_fixed_supports.restype = c_int
    return library


class NativeCpuAttention(AttentionBackend):
    """Decode sequences (one new token) of a contiguous bf16/fp32 CPU cache run the C kernel: no
    gather, each K/V row read once per step, fp32 online softmax, parallel over sequences (OpenMP,
    ``torch.get_num_threads()`` threads). Prefill sequences, and whole steps the kernel cannot serve
    (CUDA tensors, a strided cache, other dtypes, unsupported shapes), run ``TorchPagedAttention``.

    A layer's options (a sliding ``window``, attention ``sinks``, a logit ``softcap``) go to the kernel with its
    decode rows (it reads only the blocks of each window) and to the torch backend with its prefill rows.

    ``check_available()`` (called by the registry) compiles the kernel on first use and raises
    ``BackendUnavailableError`` with the compiler's message when that fails.
    """

    name: ClassVar[str] = "cpu_native"
    supports_window: ClassVar[bool] = True
    supports_sinks: ClassVar[bool] = True
    supports_softcap: ClassVar[bool] = True

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._library = _library() if self.device.type == "cpu" else None
        self._torch = TorchPagedAttention(self.device)
        self._torch_planned: str | None = None
        self._plan: NativeStepPlan | None = None
        self._supported: dict[tuple[int, ...], bool] = {}

    @classmethod
    def check_available(cls) -> None:
        _library()

    def plan(self, meta: AttentionMetadata) -> None:
        self._torch_planned = None
        if self._library is None or meta.device.type != "cpu" or not meta.decode_seqs:
            self._plan = NativeStepPlan(meta, None, meta, None)
            return
        decode, prefill = meta.decode_seqs, meta.prefill_seqs
        widest = max(-(-meta.seq_lens[i] // meta.block_size) for i in decode)
        all_decode = not prefill
        tables = meta.block_tables if all_decode else meta.block_tables[torch.tensor(decode)]
        token_index = None if all_decode else torch.tensor([meta.query_starts[i] for i in decode])
        slots = meta.slot_mapping if token_index is None else meta.slot_mapping[token_index]
        tables = tables[:, :widest].to(torch.int32).contiguous()
        lowest = min(int(tables.min()), int(slots.min()))
        if lowest < 0:
            raise ValueError(f"negative block or slot in the step's metadata ({lowest})")
        decode_plan = DecodePlan(
            token_index=token_index,
            rows=kv_rows(slots, meta.block_size).contiguous(),
            block_tables=tables,
            seq_lens=torch.tensor([meta.seq_lens[i] for i in decode], dtype=torch.int32),
            highest_block=max(int(tables.max()), int(slots.max()) // meta.block_size),
        )
        prefill_meta = prefill_index = None
        if prefill:
            index = [t for i in prefill for t in range(meta.query_starts[i], meta.query_starts[i + 1])]
            prefill_index = torch.tensor(index)
            prefill_meta = AttentionMetadata(
                query_lens=[meta.query_lens[i] for i in prefill],
                seq_lens=[meta.seq_lens[i] for i in prefill],
                block_tables=meta.block_tables[torch.tensor(prefill)],
                slot_mapping=meta.slot_mapping[prefill_index],
                block_size=meta.block_size,
            )
        self._plan = NativeStepPlan(meta, decode_plan, prefill_meta, prefill_index)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None, softcap: float | None = None,
    ) -> torch.Tensor:
        plan = self._plan
        if plan is None:
            raise RuntimeError("NativeCpuAttention.forward called before plan()")
        if window is not None and window >= plan.meta.max_seq_len:
            window = None  # a window that hides nothing is none
        options = LayerOptions(window, sinks, softcap)
        if plan.decode is None or not self._native_fits(q, kv_cache):
            return self._torch_forward("all", plan.meta, q, k, v, kv_cache, scale, options)
        num_tokens = q.shape[0]
        if num_tokens != plan.meta.num_tokens:
            raise ValueError(f"planned {plan.meta.num_tokens} tokens, got q of {num_tokens}")
        decode = plan.decode
        if decode.highest_block >= kv_cache.shape[0] or plan.meta.block_size != kv_cache.shape[2]:
            raise ValueError(
                f"the step uses block {decode.highest_block} of {plan.meta.block_size} slots; "
                f"the cache is {list(kv_cache.shape)}"
            )
        if decode.token_index is None:
            return self._decode(decode, q, k, v, kv_cache, scale, options)
        index = decode.token_index
        out = torch.empty(q.shape, dtype=q.dtype)
        out[index] = self._decode(decode, q[index], k[index], v[index], kv_cache, scale, options)
        if plan.prefill_meta is not None:
            assert plan.prefill_index is not None
            i = plan.prefill_index
            out[i] = self._torch_forward("prefill", plan.prefill_meta, q[i], k[i], v[i], kv_cache, scale, options)
        return out

    def _native_fits(self, q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        if not (
            kv_cache.device.type == "cpu"
            and q.device.type == "cpu"
            and kv_cache.dtype in NATIVE_DTYPES
            and q.dtype == kv_cache.dtype
            and kv_cache.is_contiguous()
            and q.shape[2] == kv_cache.shape[4]
        ):
            return False
        shape = (q.shape[1], kv_cache.shape[3], q.shape[2], kv_cache.shape[2])
        if shape not in self._supported:
            assert self._library is not None
            self._supported[shape] = bool(self._library.paged_decode_supports(*shape))
        return self._supported[shape]

    def _decode(
        self,
        plan: DecodePlan,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        scale: float,
        options: LayerOptions,
    ) -> torch.Tensor:
        """Writes the decode tokens' K/V into the cache (inside the kernel, into the block that it has
        just prefetched) and returns their attention ``[n, Hq, D]``."""
        assert self._library is not None
        num_seqs, num_heads, head_dim = q.shape
        _, _, block_size, num_kv_heads, _ = kv_cache.shape
        if k.shape != v.shape or k.shape != (num_seqs, num_kv_heads, head_dim):
            raise ValueError(
                f"k, v must be [{num_seqs}, {num_kv_heads}, {head_dim}], got {list(k.shape)}, {list(v.shape)}"
            )
        if k.dtype != kv_cache.dtype or v.dtype != kv_cache.dtype:
            raise TypeError(f"k/v dtype {k.dtype}/{v.dtype} differs from the cache's {kv_cache.dtype}")
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = torch.empty_like(q)
        sinks = None if options.sinks is None else options.sinks.to(torch.float32).contiguous()
        if sinks is not None and sinks.shape != (num_heads,):
            raise ValueError(f"sinks must be [{num_heads}], got {list(sinks.shape)}")
        kernel = self._library.paged_decode_bf16 if q.dtype == torch.bfloat16 else self._library.paged_decode_f32
        status = kernel(
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            plan.rows.data_ptr(),
            kv_cache.data_ptr(),
            plan.block_tables.data_ptr(),
            plan.seq_lens.data_ptr(),
            num_seqs,
            plan.block_tables.shape[1],
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale,
            out.data_ptr(),
            torch.get_num_threads(),
            0,
            None if sinks is None else sinks.data_ptr(),
            options.softcap or 0.0,
            options.window or 0,
        )
        if status != 0:
            raise RuntimeError(
                f"paged_decode failed with status {status} (q {list(q.shape)}, cache {list(kv_cache.shape)})"
            )
        return out

    def _torch_forward(
        self,
        which: str,
        meta: AttentionMetadata,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        scale: float,
        options: LayerOptions,
    ) -> torch.Tensor:
        if self._torch_planned != which:
            self._torch.plan(meta)
            self._torch_planned = which
        return self._torch.forward(q, k, v, kv_cache, scale, **options.keywords())
