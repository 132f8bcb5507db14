"""Templating and tokenizing a long prompt off the gateway's event loop.

Tokenizing is CPU work: a prompt at the character guard's limit (``max_model_len`` × the longest token's
spelling) takes about a second when its text is CJK, and on the event loop that second stalls every other
request's stream. A prompt with more than ``INLINE_CHARS`` characters, or more than ``INLINE_MESSAGES`` chat
messages, is therefore tokenized on a worker thread (the fast tokenizer releases the GIL while it
encodes; a chat template renders in Python, which yields the GIL every few milliseconds). Shorter ones
stay on the loop, where a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from services.engine.tokenizer import ChatMessage

INLINE_CHARS = 2048  # about a millisecond of tokenizing
INLINE_MESSAGES = 64
WORKERS = 2

T = TypeVar("T")


def tokenizes_inline(prompt: str | None, messages: Sequence[ChatMessage] | None) -> bool:
    """Whether a prompt is short enough to template and tokenize on the event loop."""
    if prompt is not None and len(prompt) > INLINE_CHARS:
        return False
    if messages is None:
        return True
    return len(messages) <= INLINE_MESSAGES and sum(len(m.content) for m in messages) <= INLINE_CHARS


class TokenizerThreads:
    """A few worker threads for long prompts; at most ``WORKERS`` tokenize at once, the rest wait in
    order. A caller cancelled while it waits leaves the queue; one cancelled while its prompt is being
    tokenized lets that finish and drops the result."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")

    async def run(self, work: Callable[[], T], *, inline: bool) -> T:
        """``work()`` on the loop when ``inline``, else on a worker thread (with the caller's context
        variables: its log fields and trace span)."""
        if inline:
            return work()
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, context.run, work)

    def close(self) -> None:
        """Stop taking new work; what was taken finishes on its thread (its caller then sees the drain)."""
        self._pool.shutdown(wait=False)
