"""Templating and tokenizing a long prompt off the gateway's event loop.

Tokenizing is CPU work: a prompt at the character guard's limit (``max_model_len`` × the longest token's
spelling) takes about a second when its text is CJK, and on the event loop that second stalls every other
request's stream. A prompt with more than ``INLINE_CHARS`` characters, or more than ``INLINE_MESSAGES``
chat messages (a batch's prompts counted together), is therefore tokenized on a worker thread (the fast
tokenizer releases the GIL while it encodes; a chat template renders in Python, which yields the GIL
every few milliseconds). Shorter ones stay on the loop, where a thread hop would cost more than the work.
Likewise ``/detokenize`` of more than ``INLINE_TOKENS`` ids. A chat request whose template also renders
``tools`` or ``chat_template_kwargs`` always goes to a thread: their size is the client's, and not counted."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from services.engine.tokenizer import ChatMessage

INLINE_CHARS = 2048  # about a millisecond of tokenizing (a few for CJK text)
INLINE_MESSAGES = 64
INLINE_TOKENS = 4096  # ids to detokenize
WORKERS = 2

T = TypeVar("T")
Prompt = tuple[str | None, Sequence[ChatMessage] | None]  # a text, or chat messages


def tokenizes_inline(prompt: str | None, messages: Sequence[ChatMessage] | None, templated: bool = False) -> bool:
    """Whether a prompt is short enough to template and tokenize on the event loop. ``templated``: the chat
    template also renders tools or template variables, whose size is not counted here: never inline."""
    return not templated and all_tokenize_inline([(prompt, messages)])


def all_tokenize_inline(prompts: Iterable[Prompt]) -> bool:
    """Whether prompts tokenized one after another (a completions batch) are, together, short enough."""
    chars = messages = 0
    for prompt, chat in prompts:
        chars += len(prompt) if prompt is not None else 0
        if chat is not None:
            messages += len(chat)
            if messages > INLINE_MESSAGES:  # before the contents are read: there may be many
                return False
            chars += sum(len(m.content) for m in chat)
        if chars > INLINE_CHARS:
            return False
    return True


class TokenizerThreads:
    """A few worker threads for long prompts; at most ``WORKERS`` tokenize at once, the rest wait in
    order. A caller cancelled while it waits leaves the queue; one cancelled while its prompt is being
    tokenized lets that finish and drops the result."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")
        self._closed = False
        self.pending = 0  # calls waiting for a thread or running on one

    async def run(self, work: Callable[[], T], *, inline: bool) -> T:
        """``work()`` on the loop when ``inline`` (or once closed: the process is stopping), else on a
        worker thread (with the caller's context variables: its log fields and trace span)."""
        if inline or self._closed:
            return work()
        context = contextvars.copy_context()
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, context.run, work)
        finally:
            self.pending -= 1

    def close(self) -> None:
        """Stop the threads once what was taken is done (work that comes later runs on the loop)."""
        self._closed = True
        self._pool.shutdown(wait=False)
