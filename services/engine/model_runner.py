"""Turns a scheduled step into tensors, runs the model over the paged KV cache, and samples
(``step_sampling``)."""

from __future__ import annotations

from collections.abc import Sequence

import structlog
import torch

from kernels.attention.base import AttentionBackend
from kernels.attention.chunked import ChunkedAttention
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import create_backend
from kernels.attention.sparse_index import SparseIndexAttention
from kernels.gated_delta import Save
from kernels.linear import RowPaths
from services.engine.decode_graphs import GraphOptions, build_decode_graphs
from services.engine.logprob_compute import token_logprobs
from services.engine.logprobs import TokenLogprobs
from services.engine.model.decoder import DecoderModel
from services.engine.recurrent_states import RecurrentStates
from services.engine.step_batch import StepBatch
from services.engine.step_sampling import StepSamples, sample_step

log = structlog.get_logger(__name__)

DETERMINISTIC_ATTENTION = "cpu_fixed_order"
"""The attention backend of the deterministic mode: one reduction order per query, whatever its step."""


class ModelRunner:
    """Owns the model, the KV cache tensor ``[layers, blocks, 2, block_size, kv_heads, head_dim]`` and
    the attention backend; :meth:`execute` runs one step and returns the sampled token per request.

    ``deterministic``: attention through :data:`DETERMINISTIC_ATTENTION` (another named backend is refused
    with ``ValueError``), so that with a ``deterministic`` model a row's logits do not depend on its step.
    With a ``deterministic`` model each row's projections take the path of its position's kind
    (:class:`RowPaths`): a prompt position (``< num_prompt_tokens``) dense, an output position 4-bit. A
    position's kind depends on its request only, never on batching, chunking, prefix hits, the node or a
    recompute.

    ``graphs``: decode-only steps replay captured graphs (``decode_graphs``); the KV tensor then has one
    block more than ``num_blocks``, the last, where padding rows write (the pool never hands it out).

    A hybrid model (``config.recurrent``): the KV tensor holds its attention layers only, and
    :attr:`states` (``state_capacity`` slots to start with) its recurrent layers' states; :meth:`execute`
    takes each scheduled request's slot. Its steps run eager."""

    def __init__(self, model: DecoderModel, num_blocks: int, block_size: int, attention_backend: str | None = None,
                 deterministic: bool = False, graphs: GraphOptions | None = None, state_capacity: int = 1,
                 state_checkpoints: int = 0):
        if deterministic:
            if attention_backend not in (None, "auto", DETERMINISTIC_ATTENTION):
                raise ValueError(f"the deterministic mode needs attention backend {DETERMINISTIC_ATTENTION!r}, "
                                 f"not {attention_backend!r}")
            attention_backend = DETERMINISTIC_ATTENTION
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        if cfg.has_recurrent_state and graphs is not None:  # states are read and written per sequence: eager only
            log.warning("decode graphs off: a hybrid model's recurrent layers run eager", model=cfg.name)
            graphs = None
        sink = 1 if graphs is not None else 0
        self.kv_cache = torch.zeros(len(cfg.kv_layers), num_blocks + sink, 2, block_size, cfg.num_kv_heads,
                                    cfg.head_dim, dtype=model.dtype, device=model.device)
        self.kv_layers = list(self.kv_cache.unbind(0))
        self.states: RecurrentStates | None = None
        if cfg.recurrent is not None:
            self.states = RecurrentStates(cfg.recurrent, state_capacity, model.dtype, model.device, state_checkpoints)
        chunk = cfg.attention_chunk
        if chunk is not None and chunk % block_size:
            raise ValueError(f"the model's attention chunk of {chunk} tokens is not a whole number of blocks of "
                             f"{block_size}: use a block size that divides it")
        # a model without KV never attends: the torch backend, which holds nothing (FlashInfer's holds a workspace)
        self.attention = _attention_for(model, attention_backend) if cfg.kv_layers \
            else create_backend("torch", model.device)
        self.graphs = None if graphs is None else build_decode_graphs(model, self.kv_layers, num_blocks, block_size,
                                                                      graphs)
        self.graph_steps = 0  # steps replayed from a graph

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv_cache.numel() * self.kv_cache.element_size()

    @torch.inference_mode()
    def execute(self, batch: StepBatch, block_tables: dict[str, list[int]],
                state_slots: dict[str, int] | None = None,
                state_saves: Sequence[Save] = ()) -> StepSamples:
        """Run one step. ``state_slots``: each scheduled request's state slot (a hybrid model's); ``state_saves``: the
        state checkpoints the step writes."""
        if self.states is not None:
            assert state_slots is not None, "a hybrid model's step needs its requests' state slots"
            self.states.set_plan([state_slots[s.request.request_id] for s in batch.scheduled],
                                 [s.num_new_tokens for s in batch.scheduled], [s.start == 0 for s in batch.scheduled],
                                 state_saves)
        input_ids: list[int] = []
        positions: list[int] = []
        query_lens, seq_lens, tables, logits_indices, samplers, prompt_lens = [], [], [], [], [], []
        prompt_rows: list[tuple[int, int, int]] = []  # (input row, the prompt token it predicts, k)
        prompt_askers: list[tuple[str, int]] = []  # (request id, its rows), in row order
        for item in batch.scheduled:
            request = item.request
            end = item.start + item.num_new_tokens
            asked = request.sampling.prompt_logprobs
            if asked is not None and request.num_output_tokens == 0 and item.start < request.num_prompt_tokens - 1:
                last = min(end, request.num_prompt_tokens - 1)  # a row predicting a prompt token
                prompt_rows += [(len(input_ids) + p - item.start, request.token_ids[p + 1], asked)
                                for p in range(item.start, last)]
                prompt_askers.append((request.request_id, last - item.start))
            input_ids.extend(request.token_ids[item.start:end])
            positions.extend(range(item.start, end))
            query_lens.append(item.num_new_tokens)
            seq_lens.append(end)
            prompt_lens.append(request.num_prompt_tokens)
            tables.append(block_tables[request.request_id])
            if item.samples:
                logits_indices.append(len(input_ids) - 1)
                samplers.append(request)
        # a graph gives logits only: a step with prompt rows or an embedding (a one-token prompt's) runs eager
        if self.graphs is not None and len(samplers) == len(query_lens) and max(query_lens) == 1 \
                and not prompt_rows and not any(r.embed for r in samplers) \
                and self.graphs.bucket_for(len(query_lens)) is not None:
            self.graph_steps += 1
            return sample_step(self.graphs.run(input_ids, positions, seq_lens, tables), samplers)
        device = self.model.device
        if self.kv_layers:  # (a model without KV never attends)
            self.attention.plan(AttentionMetadata.build(query_lens, seq_lens, tables, self.block_size, device,
                                                        prompt_lens if self.model.deterministic else None))
        hidden = self.model.final_hidden(
            torch.tensor(input_ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            self.kv_layers,
            self.attention,
            torch.tensor(logits_indices + [row for row, _, _ in prompt_rows], dtype=torch.long, device=device),
            _row_paths(batch, device) if self.model.deterministic else None,
            self.states,
        )
        samples = sample_step(self.model.logits(hidden[:len(samplers)]), samplers) if samplers else StepSamples()
        embedding_rows = [(i, r.request_id) for i, r in enumerate(samplers) if r.embed]
        if embedding_rows:  # the final-normed state of the last prompt token, before the LM head
            states = hidden[[i for i, _ in embedding_rows]].float().cpu()
            samples.embeddings = {rid: states[n].tolist() for n, (_, rid) in enumerate(embedding_rows)}
        if prompt_rows:
            entries = iter(_prompt_logprobs(self.model, hidden[len(samplers):], prompt_rows))
            samples.prompt_logprobs = {rid: [next(entries) for _ in range(n)] for rid, n in prompt_askers}
        return samples


PROMPT_LOGPROB_ROWS = 256
"""Prompt rows' logits and logprobs are computed this many at a time: a chunk of 1024 prompt rows on a 152k
vocabulary would otherwise hold its float32 logits (620 MB) and their temporaries at once."""


def _prompt_logprobs(model: DecoderModel, hidden: torch.Tensor, rows: list[tuple[int, int, int]]
                     ) -> list[TokenLogprobs]:
    """The entry of each prompt row (``(input row, the token it predicts, k)``; ``hidden``: the rows' final
    hidden states, in the same order)."""
    out: list[TokenLogprobs] = []
    for start in range(0, len(rows), PROMPT_LOGPROB_ROWS):
        piece = rows[start:start + PROMPT_LOGPROB_ROWS]
        logits = model.logits(hidden[start:start + len(piece)])
        out += token_logprobs(logits, [t for _, t, _ in piece], [k for _, _, k in piece])
    return out


def _attention_for(model: DecoderModel, name: str | None) -> AttentionBackend:
    """The backend ``name`` ("auto" by default) builds for the model's device. A model with sliding-window
    layers, attention sinks or an attention logit softcap needs one that takes them (every backend "auto" picks
    does); another is refused, naming what it lacks (``ValueError``). A model with chunked layers gets two, one for
    those layers (:class:`ChunkedAttention`); one with an indexer's sparse attention, a :class:`SparseIndexAttention`
    around it."""
    attention = create_backend(name, model.device)
    chunk = model.config.attention_chunk
    if chunk is not None:
        attention = ChunkedAttention(attention, create_backend(attention.name, model.device), chunk)
    if model.config.mla is not None and model.config.mla.index is not None:  # DeepSeek Sparse Attention
        attention = SparseIndexAttention(attention)
    lacking = [what for what, needed, has in (
        ("sliding-window attention", model.config.has_windows, attention.supports_window),
        ("attention sinks", model.config.attention_sinks, attention.supports_sinks),
        ("attention logit softcapping", model.config.attn_logit_softcap is not None, attention.supports_softcap),
    ) if needed and not has]
    if not lacking:
        return attention
    missing = " nor ".join(lacking)
    if model.deterministic:
        raise ValueError(f"the deterministic mode's attention ({attention.name}) has no {missing}, which this "
                         "model's layers use")
    raise ValueError(f"attention backend {attention.name!r} has no {missing}, which this model's layers use; "
                     "use 'auto', 'torch', 'cpu_native' or 'flashinfer'")


def _row_paths(batch: StepBatch, device: torch.device) -> RowPaths:
    """Each row of the step dense if it computes a prompt position of its request, else 4-bit."""
    dense: list[bool] = []
    for item in batch.scheduled:
        start, end = item.start, item.start + item.num_new_tokens
        prompt_end = min(max(item.request.num_prompt_tokens, start), end)
        dense += [True] * (prompt_end - start) + [False] * (end - prompt_end)
    return RowPaths.of(dense, device)
