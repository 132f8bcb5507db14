"""Which request holds which recurrent-state slot (a hybrid model's; ``recurrent_states.py`` holds the tensors).

A request holds a slot while it runs here: from the step that first schedules it (or a decode node's commit,
which writes the state its prefill node computed) until it leaves the running set (finished, handed off,
preempted, aborted), when the next step's sweep frees it. A request that runs again after a preemption starts
from its first token, and from a zeroed state. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class StateSlots:
    """``capacity`` slots (the engine's ``max_num_seqs``: no more requests run at once)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._slots

    def assign(self, request_id: str) -> int:
        """The request's slot, taking a free one (the lowest) if it holds none."""
        slot = self._slots.get(request_id)
        if slot is None:
            if self._free:
                self._free.sort(reverse=True)
                slot = self._free.pop()
            else:
                assert self._next < self.capacity, f"{len(self._slots)} requests hold all {self.capacity} state slots"
                slot, self._next = self._next, self._next + 1
            self._slots[request_id] = slot
        return slot

    def holders(self) -> set[str]:
        return set(self._slots)

    def slot_of(self, request_id: str) -> int:
        return self._slots[request_id]

    def assign_all(self, request_ids: Iterable[str]) -> dict[str, int]:
        return {rid: self.assign(rid) for rid in request_ids}

    def release(self, request_id: str) -> None:
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    def sweep(self, runs: Callable[[str], bool]) -> None:
        """Free the slots of the requests for which ``runs`` is False."""
        for request_id in [rid for rid in self._slots if not runs(rid)]:
            self.release(request_id)
