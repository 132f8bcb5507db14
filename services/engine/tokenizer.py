"""Tokenizer and chat template through ``transformers.AutoTokenizer`` (GGUF file or model directory; a GGUF
file's tokenizer is converted once, :mod:`services.engine.gguf_tokenizer`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers.decoders
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from services.engine import chat_template, gguf_tokenizer
from services.engine.chat_template import DEFAULT_OPTIONS, ChatTemplateOptions
from services.engine.errors import InvalidRequestError

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
TEMPLATE_ROLE = {"developer": "system"}  # OpenAI's new name for system instructions; templates know "system"


@dataclass(frozen=True)
class ToolCallRecord:
    """A tool call an assistant made earlier in the conversation (``arguments``: JSON text, as OpenAI sends
    it; the template gets it parsed, as Hugging Face templates expect a mapping)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation. ``tool_calls``: an assistant's calls; ``tool_call_id`` and ``name``:
    a ``tool`` message's answer to one of them; ``reasoning``: an assistant's earlier reasoning (the
    ``reasoning_content`` a client sends back), given to the template under both names templates read it by:
    ``reasoning_content`` (Qwen3's) and ``thinking`` (GPT-OSS's, which keeps a tool call's analysis)."""

    role: str
    content: str
    tool_calls: tuple[ToolCallRecord, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """The message as Hugging Face chat templates take it."""
        out: dict[str, Any] = {"role": TEMPLATE_ROLE.get(self.role, self.role), "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": call.id, "type": "function",
                                  "function": {"name": call.name, "arguments": _arguments(call.arguments)}}
                                 for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning is not None:
            out["reasoning_content"] = out["thinking"] = self.reasoning
        return out


def _template_dict(message: Any) -> dict[str, Any]:
    """A :class:`ChatMessage`, or any message with ``role`` and ``content`` (the gRPC front passes its
    ``pdserve.v1.ChatMessage`` protos uncopied), as a chat template takes it."""
    if isinstance(message, ChatMessage):
        return message.template_dict()
    return {"role": TEMPLATE_ROLE.get(message.role, message.role), "content": message.content}


def _arguments(text: str) -> Any:
    """A call's arguments parsed (templates write them with ``tojson``); text that is not JSON stays text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def custom_tokenizer_class(directory: Path) -> str | None:
    """The tokenizer class a model directory's ``tokenizer_config.json`` maps to code of its own (``auto_map``:
    Kimi K2's and Moonlight's tiktoken tokenizers, ChatGLM's, InternLM's), or None; transformers runs it only
    where it has no class of that name itself."""
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if isinstance(auto_map, dict) and "AutoTokenizer" in auto_map:
        classes = auto_map["AutoTokenizer"]
        named = [c for c in (classes if isinstance(classes, list) else [classes]) if isinstance(c, str)]
        return named[0] if named else "its AutoTokenizer entry"
    return None


PROCESSOR_TEMPLATE = "chat_template.json"


def _load_hf(path: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    if path.is_dir():
        try:
            hf = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        except ValueError as error:  # transformers': "... contains custom code ... trust_remote_code=True"
            if trust_remote_code or "trust_remote_code" not in str(error):
                raise
            custom = custom_tokenizer_class(path) or "a class of its own"
            raise ValueError(f"{path}: its tokenizer is code the model directory brings ({custom}); pass "
                             f"--trust-remote-code to run it (as transformers and vLLM require)") from None
        return _with_processor_template(hf, path)
    return AutoTokenizer.from_pretrained(str(gguf_tokenizer.converted_dir(path)))


def _with_processor_template(hf: PreTrainedTokenizerBase, path: Path) -> PreTrainedTokenizerBase:
    """``hf``, with the chat template of the directory's ``chat_template.json`` where the tokenizer has none: a
    vision-language model's processor keeps its template there (Qwen2.5-VL's, Qwen3-VL's, Mistral 3's), which
    transformers' tokenizer does not read and vLLM does."""
    file = path / PROCESSOR_TEMPLATE
    if getattr(hf, "chat_template", None) or not file.is_file():
        return hf
    try:
        template = json.loads(file.read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"{file}: not a processor's chat template ({error})") from None
    if not isinstance(template, str) or not template:
        raise ValueError(f"{file}: its chat_template is not a template's text")
    hf.chat_template = template
    return hf


class Tokenizer:
    """Text ↔ token ids, chat templating, and the ids that end a generation."""

    def __init__(self, hf: PreTrainedTokenizerBase, eos_token_ids: Sequence[int] = ()):
        self.hf = hf
        eos = set(eos_token_ids)
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        self.eos_token_ids = tuple(sorted(eos))
        self._kept_special: frozenset[int] = frozenset()  # special tokens whose text decode keeps
        self._dropped_special: frozenset[int] = frozenset()  # the other special tokens, once some are kept

    @classmethod
    def load(cls, path: str | Path, eos_token_ids: Sequence[int] = (), trust_remote_code: bool = False) -> Tokenizer:
        """``trust_remote_code``: run a tokenizer class the model directory brings (``--trust-remote-code``);
        without it such a tokenizer is a ``ValueError`` naming the flag."""
        return cls(_load_hf(Path(path), trust_remote_code), eos_token_ids)

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

    def encode_plain(self, text: str) -> list[int]:
        """``text``'s ids without the special tokens the tokenizer adds to a prompt (BOS)."""
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; special tokens dropped (``skip_special_tokens``), except those
        :meth:`keep_special_tokens` named."""
        ids = list(token_ids)
        if skip_special_tokens and self._kept_special and not self._kept_special.isdisjoint(ids):
            return self.hf.decode([t for t in ids if t not in self._dropped_special], skip_special_tokens=False)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def keep_special_tokens(self, texts: Sequence[str]) -> tuple[str, ...]:
        """Keep the text of these special tokens in decoded output (a tool-call or reasoning marker the
        parsers read, e.g. Mistral's ``[TOOL_CALLS]``); texts that are not one special token of this
        vocabulary are ignored. Returns those kept."""
        special = set(self.hf.all_special_ids) | {i for i, t in self.hf.added_tokens_decoder.items() if t.special}
        kept = {text: self.hf.convert_tokens_to_ids(text) for text in texts}
        kept = {text: i for text, i in kept.items()
                if isinstance(i, int) and i in special and self.hf.convert_ids_to_tokens(i) == text}  # not unk
        self._kept_special = self._kept_special | frozenset(kept.values())
        self._dropped_special = frozenset(self.hf.all_special_ids) - self._kept_special  # once: decode is hot
        return tuple(kept)

    @property
    def chat_template(self) -> str:
        """The chat template's source ("" when the tokenizer has none)."""
        template = getattr(self.hf, "chat_template", None)
        return template if isinstance(template, str) else ""

    def use_chat_template(self, source: str) -> None:
        """Serve with ``source`` as the chat template, in place of the tokenizer's own (``--chat-template``;
        ``chat_template.template_source`` reads and checks it)."""
        self.hf.chat_template = source

    @property
    def template_takes_tools(self) -> bool:
        """The chat template renders a ``tools`` list (Qwen2.5/3, Llama 3.1+, Mistral do; SmolLM2's does not:
        the HTTP front then describes the tools in a system block)."""
        return "tools" in self.chat_template

    def apply_chat_template(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] = (),
                            options: ChatTemplateOptions = DEFAULT_OPTIONS) -> list[int]:
        """``tools``: OpenAI tool definitions (``{"type": "function", "function": {...}}``), given to the
        template as its ``tools``; ``options``: see :mod:`services.engine.chat_template`."""
        rendered = chat_template.render(self.hf, self._template_source(tools), self._template_messages(messages),
                                        tools, options)
        return self.encode_plain(rendered)

    def open_turn(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] = (),
                  options: ChatTemplateOptions = DEFAULT_OPTIONS) -> str | None:
        """The text the prompt writes of the turn the model is to continue (``chat_template.open_turn``)."""
        return chat_template.open_turn(self.hf, self._template_source(tools), self._template_messages(messages),
                                       tools, options)

    def prompt_reasoning(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]],
                         options: ChatTemplateOptions, start_marker: str, end_marker: str) -> str:
        """Whether the turn the model continues already closed its reasoning, or opened it
        (``chat_template.prompt_reasoning``)."""
        return chat_template.prompt_reasoning(self.hf, self._template_source(tools), self._template_messages(messages),
                                              tools, options, start_marker, end_marker)

    def _template_source(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """The chat template that renders a conversation (with ``tools``: a tokenizer's ``tool_use`` one, where
        it has named templates)."""
        try:
            return self.hf.get_chat_template(tools=list(tools) or None)
        except ValueError:
            raise InvalidRequestError("messages", "this model has no chat template: send a prompt or token_ids"
                                      ) from None

    @staticmethod
    def _template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        if not messages:
            raise InvalidRequestError("messages", "at least one message is required")
        for i, message in enumerate(messages):
            if message.role not in CHAT_ROLES:
                raise InvalidRequestError(
                    f"messages[{i}].role", f"unknown role {message.role!r} (expected one of {sorted(CHAT_ROLES)})"
                )
        return [_template_dict(m) for m in messages]
