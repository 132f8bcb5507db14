"""A hybrid model's prefix cache: checkpoints of the recurrent state, each the state after a prefix that ends on a
block boundary, keyed by the chained key of that prefix's last block. Torch-free; ``recurrent_states.py`` holds the
tensors (checkpoint ``c`` is its row ``c``).

A hybrid model's KV blocks do not hold its recurrent layers' state, so a prefix hit is good only as far as the
deepest matched block that has a checkpoint (:meth:`StateCheckpoints.usable`): the request's slot starts from that
checkpoint and the rest of its prompt is computed. A request saves its state, during the step that computes the
position (mid-chunk, no extra step), at (:meth:`StateCheckpoints.positions`):

* the last block boundary of its prompt before its last token, so that the same prompt again, or a next turn of a chat
  that starts with it, is served from there;
* where its prompt leaves the KV blocks already cached, when no checkpoint covers them: the point where two prompts
  that share a system prompt part, so that a third one with that system prompt is served from there.

Checkpoints are evicted least recently used first; one whose blocks were evicted is never matched and goes in turn
(SGLang's Mamba radix cache and vLLM's aligned Mamba prefix caching keep states at block boundaries the same way).
With a capacity of 0 nothing is saved and no hit is usable (the KV blocks may still be shared where the state comes
from elsewhere: a decode node's commit).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from kvcache.hashing import BlockHash
from kvcache.manager import NO_PREFIX, PrefixMatch


class StateCheckpoints:
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"state checkpoints need a capacity of at least 0, got {capacity}")
        self.capacity = capacity
        self._by_key: OrderedDict[BlockHash, int] = OrderedDict()  # least recently used first
        self._free = list(range(capacity - 1, -1, -1))  # popped from the end: checkpoint 0 first
        self.saves_total = 0
        self.hits_total = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: BlockHash) -> bool:
        return key in self._by_key

    def usable(self, match: PrefixMatch) -> PrefixMatch:
        """The part of ``match`` that a checkpoint covers: up to its deepest block that has one (a pure lookup)."""
        for n in range(match.num_blocks, 0, -1):
            if match.block_hashes[n - 1] in self._by_key:
                return PrefixMatch(match.block_ids[:n], n * match.num_tokens // match.num_blocks,
                                   match.block_hashes[:n])
        return NO_PREFIX

    @staticmethod
    def positions(num_prompt_tokens: int, match: PrefixMatch, usable: PrefixMatch, block_size: int
                  ) -> tuple[int, ...]:
        """Where a request admitted with prefix hit ``usable`` (of the KV blocks ``match``) saves its state: the last
        block boundary before its prompt's last token, and the end of ``match`` when no checkpoint covers it; only
        those past ``usable``, in order."""
        last = (num_prompt_tokens - 1) // block_size * block_size
        wanted = {last, match.num_tokens if match.num_blocks > usable.num_blocks else 0}
        return tuple(sorted(p for p in wanted if p > usable.num_tokens))

    def lookup(self, key: BlockHash) -> int | None:
        """The checkpoint of the prefix that ends with block ``key`` (now the most recently used), or None."""
        checkpoint = self._by_key.get(key)
        if checkpoint is not None:
            self._by_key.move_to_end(key)
            self.hits_total += 1
        return checkpoint

    def reserve(self, key: BlockHash, busy: Collection[int] = ()) -> int | None:
        """A checkpoint to save the state of the prefix ending with block ``key`` into, indexed under ``key`` from
        now: a free one, else the least recently used one not in ``busy`` (those the step saves into already: the
        kernels write a step's saves in their own order). None when ``key`` has one already, or all are busy."""
        if key in self._by_key:
            self._by_key.move_to_end(key)
            return None
        if self._free:
            checkpoint = self._free.pop()
        else:
            victim = next((k for k, c in self._by_key.items() if c not in busy), None)
            if victim is None:
                return None
            checkpoint = self._by_key.pop(victim)
        self._by_key[key] = checkpoint
        self.saves_total += 1
        return checkpoint

    def check_integrity(self) -> None:
        held = sorted(self._by_key.values())
        assert len(set(held)) == len(held), f"a checkpoint is indexed twice: {held}"
        assert sorted([*held, *self._free]) == list(range(self.capacity)), "checkpoints leak"
