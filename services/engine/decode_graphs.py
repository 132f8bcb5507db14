"""Decode steps replayed from CUDA graphs, one per batch-size bucket (``--cuda-graphs on``).

At start, for each bucket (:data:`BUCKETS` up to the first that holds ``max_num_seqs``), the model's
decode forward over fixed input buffers (token ids, positions, the attention's page-table buffers, see
``kernels.attention.graph_decode``) is captured once, largest bucket first, all graphs sharing one memory
pool. A decode-only step of ``n`` rows then runs in the smallest bucket ``b >= n``: its inputs are copied
into the buffers, rows ``n..b`` padded (token 0 at position 0 of the **sink block**, a KV block the pool
never hands out, so padding writes nothing any request reads), the attention planned outside the graph,
the graph replayed, and the first ``n`` rows of its logits sampled as usual. Anything else runs eagerly:
steps with a prompt, batches past the largest bucket, a deterministic model, and models whose forward
reads values back to the host mid-step (mixture-of-experts layers whose experts run one by one; grouped
experts, :mod:`services.engine.model.moe_grouped`, are captured): :func:`graph_support` says which, and why.

``capture`` is how a forward becomes a replay: :class:`CudaGraphCapture` on a GPU; tests on a CPU pass
:func:`eager_capture`, which re-runs the forward over the same buffers, to check the padding and the
buffers (not the capture itself, which only a GPU test can).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from types import ModuleType

import structlog
import torch

from kernels.attention.flashinfer import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
from kernels.attention.flashinfer_graph import FlashInferGraphDecode
from kernels.attention.graph_decode import GraphDecodeAttention, TorchGraphDecode
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import BackendUnavailableError
from services.engine.model.decoder import DecoderModel

log = structlog.get_logger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TORCH_GATHER_BYTES = 1 << 30
"""The pure-torch graph attention gathers every row's whole page table: buckets whose one layer would need
more than this for it (``TorchGraphDecode.peak_bytes``: the gather and its float copies) run eagerly."""
Replay = Callable[[], torch.Tensor]
Capture = Callable[[Callable[[], torch.Tensor]], Replay]


def eager_capture(forward: Callable[[], torch.Tensor]) -> Replay:
    """A stand-in for a graph on a CPU: replaying runs ``forward`` again over the same buffers."""
    return forward


class CudaGraphCapture:
    """Captures each forward into a ``torch.cuda.CUDAGraph``, all in one memory pool (largest first, so
    the smaller graphs reuse its blocks). Each forward runs once eagerly on a side stream before its
    capture: lazy allocations, kernel loading and table casts happen outside the graph."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def __call__(self, forward: Callable[[], torch.Tensor]) -> Replay:
        # on the node's device (cuda:N): torch.cuda.graph's default capture stream is the current device's
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                forward()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.Stream(self.device)):
                output = forward()
        self.graphs.append(graph)

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay


def buckets_for(max_num_seqs: int) -> tuple[int, ...]:
    """The buckets a node of ``max_num_seqs`` captures: each of :data:`BUCKETS` below it, and the first that
    holds it (the largest, 256, when it is past that: bigger batches run eagerly)."""
    holding = next((b for b in BUCKETS if b >= max_num_seqs), BUCKETS[-1])
    return tuple(b for b in BUCKETS if b <= holding)


def graph_support(model: DecoderModel) -> str:
    """Why ``model``'s decode cannot be captured ("" when it can)."""
    if model.deterministic:
        return "the deterministic mode picks each row's path per step"
    if model.config.gemma4 is not None:
        return "its layers' heads differ in number and width (the graph attention plans one shape)"
    if model.config.mla is not None and model.config.mla.index is not None:
        return "its sparse attention (an indexer picks each query's keys)"
    if any(layer.moe is not None and layer.moe.grouped is None for layer in model.layers):
        return "its mixture-of-experts layers route tokens on the host (grouped experts are off)"
    if model.config.has_windows:
        return "its sliding-window layers (the graph attention has no window)"
    if model.config.attention_chunk is not None:
        return "its chunked-attention layers (the graph attention plans one page table per sequence)"
    if model.config.attention_sinks:
        return "its attention sinks (the graph attention has none)"
    if model.config.attn_logit_softcap is not None:
        return "its attention logit softcapping (the graph attention has none)"
    return ""


class DecodeGraphs:
    """The captured decode of ``model`` over ``kv_layers``, in ``buckets`` (see the module).

    ``sink_block``: a block of ``kv_layers`` the KV pool never hands out (padding rows write there)."""

    def __init__(self, model: DecoderModel, kv_layers: list[torch.Tensor], attention: GraphDecodeAttention,
                 buckets: Sequence[int], sink_block: int, block_size: int, capture: Capture):
        if why := graph_support(model):
            raise ValueError(f"decode graphs cannot hold this model: {why}")
        if max(buckets) > attention.max_batch:
            raise ValueError(f"bucket {max(buckets)} is past the attention buffers' {attention.max_batch} rows")
        self.model, self.kv_layers, self.attention = model, kv_layers, attention
        self.buckets = tuple(sorted(buckets))
        self.sink_block, self.block_size = sink_block, block_size
        device, largest = model.device, self.buckets[-1]
        self._inputs = torch.zeros(2, largest, dtype=torch.long, device=device)  # token ids; positions
        self._staged = torch.zeros(2, largest, dtype=torch.long, pin_memory=device.type == "cuda")
        self.input_ids, self.positions = self._inputs.unbind(0)
        self.rows = torch.arange(largest, dtype=torch.long, device=device)
        self.replays: dict[int, Replay] = {}
        self.padded_rows = 0  # rows run as padding so far (a measure of the buckets' fit)
        with torch.inference_mode():
            for bucket in reversed(self.buckets):
                self._fill([], [], [], [], bucket)  # all padding: a valid step to capture over
                self.replays[bucket] = capture(partial(self._forward, bucket))

    def bucket_for(self, num_rows: int) -> int | None:
        """The smallest bucket that holds ``num_rows`` (None: past the largest, run eagerly)."""
        return next((b for b in self.buckets if b >= num_rows), None)

    @torch.inference_mode()
    def run(self, input_ids: list[int], positions: list[int], seq_lens: list[int],
            tables: list[list[int]]) -> torch.Tensor:
        """Float32 logits ``[n, vocab]`` of a decode-only step of ``n = len(input_ids)`` rows (row i: token
        ``input_ids[i]`` at ``positions[i] = seq_lens[i] - 1`` of the sequence in blocks ``tables[i]``). The
        tensor is the graph's output buffer: read it before the next step."""
        bucket = self.bucket_for(len(input_ids))
        if bucket is None:
            raise ValueError(f"{len(input_ids)} rows: past the largest bucket ({self.buckets[-1]})")
        self._fill(input_ids, positions, seq_lens, tables, bucket)
        self.padded_rows += bucket - len(input_ids)
        return self.replays[bucket]()[:len(input_ids)]

    def _fill(self, input_ids: list[int], positions: list[int], seq_lens: list[int], tables: list[list[int]],
              bucket: int) -> None:
        """Stage the step (padding rows: token 0 at position 0 of the sink block) and plan its attention. The
        staging buffer is pinned and rewritten only after the previous step's logits were read (a sync)."""
        n, staged = len(input_ids), self._staged
        staged[:, :bucket].zero_()
        if n:
            staged[0, :n] = torch.tensor(input_ids, dtype=torch.long)
            staged[1, :n] = torch.tensor(positions, dtype=torch.long)
        self._inputs[:, :bucket].copy_(staged[:, :bucket], non_blocking=True)
        pad = bucket - n
        meta = AttentionMetadata.build([1] * bucket, [*seq_lens, *[1] * pad], [*tables, *[[self.sink_block]] * pad],
                                       self.block_size, "cpu")  # the attention copies what it reads
        self.attention.plan(meta)

    def _forward(self, bucket: int) -> torch.Tensor:
        return self.model.forward(self.input_ids[:bucket], self.positions[:bucket], self.kv_layers, self.attention,
                                  self.rows[:bucket])


@dataclass(frozen=True)
class GraphOptions:
    """What the model runner needs to capture decode graphs. ``attention``: ``auto`` (FlashInfer's CUDA-graph
    decode where it runs: CUDA, bf16/fp16, head dim 64/128/256, flashinfer installed; else pure torch),
    ``flashinfer`` or ``torch``. ``flashinfer_module``: a stand-in for ``flashinfer`` (CPU tests)."""

    max_num_seqs: int
    max_model_len: int
    capture: Capture
    attention: str = "auto"
    flashinfer_module: ModuleType | None = None


def build_decode_graphs(model: DecoderModel, kv_layers: list[torch.Tensor], sink_block: int, block_size: int,
                        options: GraphOptions) -> DecodeGraphs | None:
    """The decode graphs of ``model`` (None, logged, where :func:`graph_support` says it cannot be held)."""
    if why := graph_support(model):
        log.warning("cuda graphs: off for this model, every step runs eagerly", why=why)
        return None
    buckets = buckets_for(options.max_num_seqs)
    max_pages = -(-options.max_model_len // block_size)
    attention = _flashinfer_graph(model, buckets, max_pages, block_size, options)
    if attention is None:
        cfg = model.config
        attention = TorchGraphDecode(model.device, max(buckets), max_pages, block_size)
        fits = tuple(b for b in buckets
                     if attention.peak_bytes(b, cfg.num_kv_heads, cfg.head_dim, model.dtype) <= TORCH_GATHER_BYTES)
        if not fits:
            log.warning("cuda graphs: off, the torch graph attention would need too much memory even at one row",
                        max_bytes_per_layer=TORCH_GATHER_BYTES, max_model_len=options.max_model_len)
            return None
        buckets = fits
    started = time.perf_counter()
    try:
        graphs = DecodeGraphs(model, kv_layers, attention, buckets, sink_block, block_size, options.capture)
    except (RuntimeError, torch.OutOfMemoryError) as exc:  # a kernel or the memory a graph cannot have
        log.warning("cuda graphs: capture failed, every step runs eagerly", error=str(exc)[:500],
                    batch_sizes=list(buckets), attention=attention.name)
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
        return None
    log.info("cuda graphs: decode captured", batch_sizes=list(graphs.buckets), attention=attention.name,
             seconds=round(time.perf_counter() - started, 2))
    return graphs


def _flashinfer_graph(model: DecoderModel, buckets: tuple[int, ...], max_pages: int, block_size: int,
                      options: GraphOptions) -> GraphDecodeAttention | None:
    cfg = model.config
    if options.attention == "torch":
        return None
    runs = (model.dtype in SUPPORTED_DTYPES and cfg.head_dim in SUPPORTED_HEAD_DIMS
            and (model.device.type == "cuda" or options.flashinfer_module is not None))
    if not runs:
        if options.attention == "flashinfer":
            raise BackendUnavailableError(f"flashinfer graph decode runs CUDA bf16/fp16 with head dims "
                                          f"{SUPPORTED_HEAD_DIMS}, not {model.dtype} / {cfg.head_dim} on "
                                          f"{model.device}")
        return None
    try:
        return FlashInferGraphDecode(model.device, buckets, max_pages, block_size,
                                     (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim), model.dtype, model.scale,
                                     flashinfer_module=options.flashinfer_module)
    except BackendUnavailableError:
        if options.attention == "flashinfer":
            raise
        log.warning("cuda graphs: flashinfer does not import, the graphs use the torch attention")
        return None
