"""The recurrent states of a hybrid model's recurrent layers (``ModelConfig.recurrent``: Gated DeltaNet, Mamba-2): one
slot per request that holds one, in tensors the model reads and writes in place, and each step's plan of which slot each
sequence of the batch uses.

Which request holds which slot is the engine's bookkeeping (:class:`services.engine.state_slots.StateSlots`); a
slot's bytes travel with its request from a prefill node to a decode node (:meth:`RecurrentStates.read`,
:meth:`RecurrentStates.write`), as its KV blocks do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.engine.model.config import LinearAttention, Mamba2


@dataclass(frozen=True)
class StatePlan:
    """A step's sequences, in batch order: the slot of each, its new rows, and whether its first token is among
    them (its state then starts from zeros)."""

    slots: tuple[int, ...]
    query_lens: tuple[int, ...]
    fresh: tuple[bool, ...]


class RecurrentStates:
    """Per recurrent layer: ``conv [capacity, conv_dim, conv_kernel - 1]`` in the model's dtype and ``ssm [capacity,
    *spec.ssm_shape]`` in float32. A step may run while a commit writes another slot: :meth:`grow` only between
    steps."""

    def __init__(self, spec: LinearAttention | Mamba2, capacity: int, dtype: torch.dtype, device: torch.device):
        self.spec, self.capacity = spec, capacity
        layers = range(len(spec.layers))
        self.conv = [torch.zeros(capacity, spec.conv_dim, spec.conv_kernel - 1, dtype=dtype, device=device)
                     for _ in layers]
        self.ssm = [torch.zeros(capacity, *spec.ssm_shape, dtype=torch.float32, device=device) for _ in layers]
        self.plan = StatePlan((), (), ())

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` slots, the states kept (call only while no step runs): one layer's tensor at a
        time, so that the old and the new copy of all of them are never held at once."""
        if capacity <= self.capacity:
            return
        for tensors in (self.conv, self.ssm):
            for i, t in enumerate(tensors):
                grown = t.new_zeros(capacity, *t.shape[1:])
                grown[:self.capacity] = t
                tensors[i] = grown
                del t
        self.capacity = capacity

    def set_plan(self, slots: Sequence[int], query_lens: Sequence[int], fresh: Sequence[bool]) -> None:
        """The next step's sequences (see :class:`StatePlan`)."""
        self.plan = StatePlan(tuple(slots), tuple(query_lens), tuple(fresh))

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (*self.conv, *self.ssm))

    def read(self, slot: int) -> bytes:
        """Slot ``slot``'s state: each layer's conv rows, then each layer's ssm matrix, raw (the same model and
        dtype read it back with :meth:`write`)."""
        parts = [t[slot].contiguous().view(torch.uint8).reshape(-1) for t in (*self.conv, *self.ssm)]
        return torch.cat(parts).cpu().numpy().tobytes()

    def write(self, slot: int, payload: bytes | memoryview) -> None:
        """Fill slot ``slot`` from :meth:`read`'s bytes; ``ValueError`` when their size is not a slot's."""
        if len(payload) != self.bytes_per_slot:
            raise ValueError(f"a recurrent state of {len(payload)} bytes, where this model's is {self.bytes_per_slot}")
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.conv[0].device)
        offset = 0
        for t in (*self.conv, *self.ssm):
            size = t[0].numel() * t.element_size()
            t[slot].view(torch.uint8).reshape(-1).copy_(data[offset:offset + size])
            offset += size
