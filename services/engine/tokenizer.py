"""Tokenizer and chat template through ``transformers.AutoTokenizer`` (GGUF file or model directory).

Building a tokenizer from GGUF metadata takes seconds, so the converted tokenizer is saved once under
``$PDSERVE_CACHE_DIR`` (default ``~/.cache/pdserve``) keyed by the file's name, size and mtime.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tokenizers.decoders
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from services.engine.errors import InvalidRequestError

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
TEMPLATE_ROLE = {"developer": "system"}  # OpenAI's new name for system instructions; templates know "system"


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


def cache_dir() -> Path:
    return Path(os.environ.get("PDSERVE_CACHE_DIR", Path.home() / ".cache" / "pdserve"))


def _load_hf(path: Path) -> PreTrainedTokenizerBase:
    if path.is_dir():
        return AutoTokenizer.from_pretrained(str(path))
    stat = path.stat()
    key = hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / "tokenizers" / key
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cached.parent))
    tokenizer.save_pretrained(str(staging))
    try:
        staging.rename(cached)
    except OSError:  # another process saved it first
        shutil.rmtree(staging, ignore_errors=True)
    return tokenizer


class Tokenizer:
    """Text ↔ token ids, chat templating, and the ids that end a generation."""

    def __init__(self, hf: PreTrainedTokenizerBase, eos_token_ids: Sequence[int] = ()):
        self.hf = hf
        eos = set(eos_token_ids)
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        self.eos_token_ids = tuple(sorted(eos))

    @classmethod
    def load(cls, path: str | Path, eos_token_ids: Sequence[int] = ()) -> Tokenizer:
        return cls(_load_hf(Path(path)), eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The longest token's spelling in the vocabulary (byte-level: one character per byte). A text of
        ``c`` characters encodes to at least ``c / max_token_chars`` tokens, so a text far longer than the
        context can be refused without tokenizing it."""
        return max(len(token) for token in self.hf.get_vocab())

    @functools.cached_property
    def _byte_of_char(self) -> dict[str, int] | None:
        """Byte-level BPE's table from a token's spelling to its bytes; None for other tokenizers."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None or not isinstance(backend.decoder, tokenizers.decoders.ByteLevel):
            return None
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        return {char: byte for byte, char in bytes_to_unicode().items()}

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for. A byte-level token holding part of a UTF-8 character gives those
        bytes (its own decode is ``\ufffd``), so a client can join them back into the character; added
        tokens and other tokenizers give their text's UTF-8."""
        table = self._byte_of_char
        if table is not None and token_id not in self.hf.added_tokens_decoder:  # added tokens: plain text
            spelling = self.hf.convert_ids_to_tokens(token_id)
            if spelling is not None and all(char in table for char in spelling):
                return bytes(table[char] for char in spelling)
        return self.decode([token_id], skip_special_tokens=False).encode()

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text)["input_ids"])

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        if not messages:
            raise InvalidRequestError("messages", "at least one message is required")
        for i, message in enumerate(messages):
            if message.role not in CHAT_ROLES:
                raise InvalidRequestError(
                    f"messages[{i}].role", f"unknown role {message.role!r} (expected one of {sorted(CHAT_ROLES)})"
                )
        rendered = self.hf.apply_chat_template(
            [{"role": TEMPLATE_ROLE.get(m.role, m.role), "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        return list(self.hf(rendered, add_special_tokens=False)["input_ids"])
