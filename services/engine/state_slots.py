"""Which request holds which recurrent-state slot (a hybrid model's; ``recurrent_states.py`` holds the tensors).

A request holds a slot while it runs here: from the step that first schedules it (or a decode node's commit,
which writes the state its prefill node computed) until it leaves the running set (finished, handed off,
preempted, aborted), when the next step's sweep frees it. A request that runs again after a preemption starts
from its first token, and from a zeroed state. Torch-free.

The states tensor has ``capacity`` slots (``max_num_seqs``) and grows only between steps, when nothing reads it
(``LLMEngine.begin_step``): more requests than that may run at once (committed or adopted over the limit, as a
lent request coming back makes), and a commit that finds no slot within the capacity parks its state on the
request (``Request.pending_state``) until a step schedules it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class StateSlots:
    def __init__(self) -> None:
        self._slots: dict[str, int] = {}
        self._free: list[int] = []  # a heap: the lowest free slot first
        self._next = 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._slots

    def assign(self, request_id: str) -> int:
        """The request's slot, taking a free one (the lowest) if it holds none."""
        slot = self._slots.get(request_id)
        if slot is None:
            if self._free:
                slot = heapq.heappop(self._free)
            else:
                slot, self._next = self._next, self._next + 1
            self._slots[request_id] = slot
        return slot

    def holders(self) -> set[str]:
        return set(self._slots)

    def free_within(self, capacity: int) -> bool:
        """Whether :meth:`assign` would give a new holder a slot below ``capacity``."""
        return bool(self._free) or self._next < capacity

    def slot_of(self, request_id: str) -> int:
        return self._slots[request_id]

    def release(self, request_id: str) -> None:
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            heapq.heappush(self._free, slot)

    def sweep(self, runs: Callable[[str], bool]) -> None:
        """Free the slots of the requests for which ``runs`` is False."""
        for request_id in [rid for rid in self._slots if not runs(rid)]:
            self.release(request_id)
