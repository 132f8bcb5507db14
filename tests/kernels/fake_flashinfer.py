"""A stand-in for the ``flashinfer`` module, in plain torch on the CPU, implementing the documented
contract of the three entry points the FlashInfer backend uses (paged ``NHD`` cache
``[pages, 2, page_size, Hkv, D]``, CSR page tables, causal mask aligned bottom-right), and of the three
fused ops of ``kernels.fused_ops`` (in place where FlashInfer's are, float32 arithmetic as its kernels do,
and their shape and layout checks). It lets the backend's plumbing (page tables, plan once per step, decode
vs prefill wrapper, append) and the fused path's run in CPU tests; the real kernels are checked against
torch by the GPU tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """``residual += input``; ``input = rmsnorm(residual) * weight``, from the unrounded float32 sum
    (flashinfer/norm, csrc/norm.cu: 2D, last dimension contiguous, weight ``[hidden]``)."""
    assert input.dim() == 2 and residual.shape == input.shape, "input, residual: (batch_size, hidden_size)"
    assert input.stride(-1) == 1 and residual.stride(-1) == 1 and weight.shape == (input.shape[1],)
    assert input.dtype == residual.dtype == weight.dtype
    x = input.float() + residual.float()
    residual.copy_(x)
    input.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float())


def silu_and_mul(input, out=None, enable_pdl=None):
    """``silu(input[..., :d]) * input[..., d:]`` in a new tensor (the kernel reads row t at t * 2d: it
    assumes a contiguous input)."""
    if input.shape[-1] % 2 != 0:
        raise ValueError("The last dimension must be even (2 * hidden_size).")
    assert input.is_contiguous(), "the kernel reads row t at t * 2d"
    d = input.shape[-1] // 2
    x = input.float()
    result = (F.silu(x[..., :d]) * x[..., d:]).to(input.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """Rotate ``query``/``key`` ``(nnz, heads * head_size)`` in place, neox ("rotate half") style or, without
    ``is_neox``, GPT-J's (dims 2i and 2i + 1 by angle i), from a float32 ``(max_seq_len, rotary_dim)`` cache: cos
    in the first half, sin in the second (flashinfer/rope.py)."""
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    assert positions.is_contiguous() and positions.dtype in (torch.int32, torch.int64) and positions.dim() == 1
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.is_contiguous()
    rotary = cos_sin_cache.shape[1]
    half = rotary // 2
    table = cos_sin_cache[positions.long()].unsqueeze(1)
    cos, sin = table[..., :half], table[..., half:]
    for x in (query, key):
        heads = x.view(x.shape[0], -1, head_size)  # as flashinfer does: raises where a view cannot be had
        assert heads.stride(-1) == 1 and heads.shape[0] == positions.shape[0] and rotary <= head_size
        if not is_neox:
            x1, x2 = heads[..., 0:rotary:2].float(), heads[..., 1:rotary:2].float()
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
            heads[..., :rotary] = rotated.to(x.dtype)
            continue
        x1, x2 = heads[..., :half].float(), heads[..., half:rotary].float()
        heads[..., :rotary] = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def _kv_lens(indptr: torch.Tensor, last_page_len: torch.Tensor, page_size: int) -> list[int]:
    pages = (indptr[1:] - indptr[:-1]).tolist()
    return [(n - 1) * page_size + int(last) for n, last in zip(pages, last_page_len.tolist(), strict=True)]


def _gather(cache: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, i: int, length: int):
    pages = indices[int(indptr[i]) : int(indptr[i + 1])].long()
    k = cache[pages, 0].flatten(0, 1)[:length]
    v = cache[pages, 1].flatten(0, 1)[:length]
    return k, v


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                          kv_indptr, kv_last_page_len, kv_layout="NHD"):
    assert kv_layout == "NHD" and paged_kv_cache.dim() == 5 and paged_kv_cache.shape[1] == 2
    assert append_key.is_contiguous() and append_value.is_contiguous()
    page_size = paged_kv_cache.shape[2]
    lens = _kv_lens(kv_indptr, kv_last_page_len, page_size)
    for t, (b, pos) in enumerate(zip(batch_indices.tolist(), positions.tolist(), strict=True)):
        assert pos < lens[b], f"append at position {pos} past sequence {b}'s length {lens[b]}"
        page = int(kv_indices[int(kv_indptr[b]) + pos // page_size])
        paged_kv_cache[page, 0, pos % page_size] = append_key[t]
        paged_kv_cache[page, 1, pos % page_size] = append_value[t]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
            window_left: int = -1) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->hts", q.double(), k) * scale
    query_pos = torch.arange(k.shape[0] - q.shape[0], k.shape[0]).view(-1, 1)
    if causal:
        scores = scores.masked_fill(torch.arange(k.shape[0]).view(1, -1) > query_pos, float("-inf"))
    if window_left >= 0:  # FlashInfer's window: the query's position and window_left positions left of it
        scores = scores.masked_fill(torch.arange(k.shape[0]).view(1, -1) < query_pos - window_left, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


@dataclass
class _Plan:
    qo_indptr: list[int]
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    heads: tuple[int, int, int]
    page_size: int
    causal: bool
    scale: float
    dtype: torch.dtype
    window_left: int = -1


@dataclass
class _Wrapper:
    workspace: torch.Tensor
    layout: str
    plans: list[_Plan] = field(default_factory=list)
    runs: int = 0

    def _run(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        assert self.plans, "run before plan"
        plan = self.plans[-1]
        num_heads, num_kv_heads, head_dim = plan.heads
        assert q.dtype == plan.dtype and q.shape[1:] == (num_heads, head_dim)
        assert cache.shape[2:] == (plan.page_size, num_kv_heads, head_dim)
        self.runs += 1
        lens = _kv_lens(plan.kv_indptr, plan.last_page_len, plan.page_size)
        out = torch.empty_like(q)
        for i, length in enumerate(lens):
            start, end = plan.qo_indptr[i], plan.qo_indptr[i + 1]
            k, v = _gather(cache, plan.kv_indptr, plan.kv_indices, i, length)
            out[start:end] = _attend(q[start:end], k, v, plan.scale, plan.causal, plan.window_left).to(q.dtype)
        return out


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, workspace, kv_layout="NHD", backend="auto"):
        super().__init__(workspace, kv_layout)
        self.backend = backend

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, causal=False, pos_encoding_mode="NONE", sm_scale=None,
             q_data_type="float16", kv_data_type=None, window_left=-1):
        assert pos_encoding_mode == "NONE" and kv_data_type in (None, q_data_type)
        self.plans.append(_Plan(qo_indptr.tolist(), paged_kv_indptr.clone(), paged_kv_indices.clone(),
                                paged_kv_last_page_len.clone(), (num_qo_heads, num_kv_heads, head_dim_qk),
                                page_size, causal, sm_scale or head_dim_qk**-0.5, q_data_type, window_left))

    def run(self, q, paged_kv_cache):
        return self._run(q, paged_kv_cache)


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    """In CUDA-graph mode (``use_cuda_graph``) the batch size is that of the given buffers, ``plan`` copies
    the page table into them and ``run`` reads them, as a replayed graph does."""

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None):
        super().__init__(workspace, kv_layout)
        self.use_tensor_cores = use_tensor_cores
        self.use_cuda_graph = use_cuda_graph
        if use_cuda_graph:
            assert paged_kv_indptr_buffer is not None and paged_kv_indices_buffer is not None
            assert paged_kv_last_page_len_buffer is not None
            assert paged_kv_indptr_buffer.numel() == paged_kv_last_page_len_buffer.numel() + 1
        self.buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, q_data_type="float16", kv_data_type=None, sm_scale=None):
        assert pos_encoding_mode == "NONE" and kv_data_type in (None, q_data_type)
        n = last_page_len.numel()
        if self.use_cuda_graph:
            indptr_buf, indices_buf, last_buf = self.buffers
            if n != last_buf.numel():
                raise ValueError(f"The batch size should be fixed in cudagraph mode, the runtime batch size {n} "
                                 f" mismatches the batch size set during initialization {last_buf.numel()}")
            indptr_buf.copy_(indptr)
            indices_buf[:indices.numel()].copy_(indices)
            last_buf.copy_(last_page_len)
            indptr, indices, last_page_len = indptr_buf, indices_buf, last_buf  # run reads the buffers
        else:
            indptr, indices, last_page_len = indptr.clone(), indices.clone(), last_page_len.clone()
        self.plans.append(_Plan(list(range(n + 1)), indptr, indices, last_page_len,
                                (num_qo_heads, num_kv_heads, head_dim), page_size, False,
                                sm_scale or head_dim**-0.5, q_data_type, window_left))

    def run(self, q, paged_kv_cache):
        assert q.shape[0] == len(self.plans[-1].qo_indptr) - 1, "decode: one query per sequence"
        return self._run(q, paged_kv_cache)
