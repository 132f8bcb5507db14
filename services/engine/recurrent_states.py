"""The recurrent states of a hybrid model's recurrent layers (``ModelConfig.recurrent``: Gated DeltaNet, Mamba-2, short
convolutions, Mamba-1): one slot per request that holds one, and the prefix cache's checkpoints, in tensors the model
reads and writes in place, and each step's plan of which slot each sequence of the batch uses and where its state is
checkpointed.

Which request holds which slot is the engine's bookkeeping (:class:`services.engine.state_slots.StateSlots`), which
checkpoint holds which prefix the prefix cache's (:class:`services.engine.state_checkpoints.StateCheckpoints`); a
slot's bytes travel with its request from a prefill node to a decode node (:meth:`RecurrentStates.read`,
:meth:`RecurrentStates.write`), as its KV blocks do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.gated_delta import Save
from services.engine.model.config import LinearAttention, Mamba1, Mamba2, ShortConv


@dataclass(frozen=True)
class StatePlan:
    """A step's sequences, in batch order: the state row of each, its new rows, and whether its first token is among
    them (its state then starts from zeros); ``saves``: the checkpoints written during the step."""

    slots: tuple[int, ...]
    query_lens: tuple[int, ...]
    fresh: tuple[bool, ...]
    saves: tuple[Save, ...] = ()


class RecurrentStates:
    """Per recurrent layer: ``conv [rows, conv_dim, conv_kernel - 1]`` in the model's dtype and (but for LFM2's short
    convolutions) ``ssm [rows, *spec.ssm_shape]`` in float32; the first ``checkpoints`` rows are the prefix cache's
    checkpoints, the ``capacity`` rows after them the requests' slots (slot ``s`` is row ``checkpoints + s``). A step
    may run while a commit writes another slot: :meth:`grow` only between steps."""

    def __init__(self, spec: LinearAttention | Mamba2 | ShortConv | Mamba1, capacity: int, dtype: torch.dtype,
                 device: torch.device, checkpoints: int = 0):
        self.spec, self.capacity, self.checkpoints = spec, capacity, checkpoints
        layers, rows = range(len(spec.layers)), checkpoints + capacity
        self.conv = [torch.zeros(rows, spec.conv_dim, spec.conv_kernel - 1, dtype=dtype, device=device)
                     for _ in layers]
        self.ssm = [] if spec.ssm_shape is None else \
            [torch.zeros(rows, *spec.ssm_shape, dtype=torch.float32, device=device) for _ in layers]
        self.plan = StatePlan((), (), ())

    @property
    def nbytes(self) -> int:
        """The memory the states hold: every layer's conv rows and matrices, checkpoints and slots."""
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.ssm))

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` slots, the states kept (call only while no step runs): one layer's tensor at a
        time, so that the old and the new copy of all of them are never held at once."""
        if capacity <= self.capacity:
            return
        for tensors in (self.conv, self.ssm):
            for i, t in enumerate(tensors):
                grown = t.new_zeros(self.checkpoints + capacity, *t.shape[1:])
                grown[:t.shape[0]] = t
                tensors[i] = grown
                del t
        self.capacity = capacity

    def set_plan(self, slots: Sequence[int], query_lens: Sequence[int], fresh: Sequence[bool],
                 saves: Sequence[Save] = ()) -> None:
        """The next step's sequences (see :class:`StatePlan`): their slots, and the checkpoints written (a save's
        ``into`` is a checkpoint's row)."""
        self.plan = StatePlan(tuple(self.checkpoints + s for s in slots), tuple(query_lens), tuple(fresh), tuple(saves))

    def restore(self, checkpoint: int, slot: int) -> None:
        """Slot ``slot`` starts from checkpoint ``checkpoint``'s state (a prefix-cache hit)."""
        for t in (*self.conv, *self.ssm):
            t[self.checkpoints + slot].copy_(t[checkpoint])

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (*self.conv, *self.ssm))

    def read(self, slot: int) -> bytes:
        """Slot ``slot``'s state: each layer's conv rows, then each layer's ssm matrix, raw (the same model and
        dtype read it back with :meth:`write`)."""
        row = self.checkpoints + slot
        parts = [t[row].contiguous().view(torch.uint8).reshape(-1) for t in (*self.conv, *self.ssm)]
        return torch.cat(parts).cpu().numpy().tobytes()

    def write(self, slot: int, payload: bytes | memoryview) -> None:
        """Fill slot ``slot`` from :meth:`read`'s bytes; ``ValueError`` when their size is not a slot's."""
        if len(payload) != self.bytes_per_slot:
            raise ValueError(f"a recurrent state of {len(payload)} bytes, where this model's is {self.bytes_per_slot}")
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.conv[0].device)
        offset, row = 0, self.checkpoints + slot
        for t in (*self.conv, *self.ssm):
            size = t[0].numel() * t.element_size()
            t[row].view(torch.uint8).reshape(-1).copy_(data[offset:offset + size])
            offset += size
