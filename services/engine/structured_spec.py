"""What a constrained request asks for: the spec of its structured output (no grammar library here).

A request's output may be constrained to a JSON schema (OpenAI's ``strict`` semantics), any JSON object,
a regular expression, one of a list of strings, or a grammar (Lark syntax, as llguidance takes it). The
spec travels with the request's sampling parameters (``SamplingParams.structured``; on the wire
``pdserve.v1.SamplingParams.structured_output``), so every node that samples a token of the request — the
prefill node's first, the decode node's after a commit, a recompute, a resume from offloaded KV or a
handover — builds the same matcher from the spec and the tokens so far (``services/engine/structured/``).

This module only describes and bounds the spec (the control plane stays free of the grammar library);
whether a schema, regex or grammar is valid is found by compiling it (``structured/compiler.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from services.engine.errors import InvalidRequestError

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 64 << 10  # a schema, regex or grammar (choices: all of them together)
MAX_CHOICES = 1024


@dataclass(frozen=True)
class StructuredSpec:
    """``kind``: one of ``KINDS``. ``text``: the JSON schema (as JSON text), the regex or the grammar; empty
    for ``json_object`` and ``choice``. ``choices``: the strings of a ``choice``. ``starts_after_token_ids``:
    the constraint applies only to the output after the first run of these tokens (a reasoning model's end of
    thinking: Qwen3's ``</think>``, GPT-OSS's ``<|channel|>final<|message|>``); before it any token may come,
    EOS included; empty: from the first token. Not part of ``key``: the compiled grammar is the same."""

    kind: str
    text: str = ""
    choices: tuple[str, ...] = ()
    starts_after_token_ids: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """A hash of the spec: compiled grammars are cached under it."""
        digest = hashlib.sha256(self.kind.encode())
        for part in (self.text, *self.choices):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part.encode("utf-8", errors="surrogatepass"))
        return digest.hexdigest()

    def check_shape(self, field: str = "structured_output") -> None:
        """Raise :class:`InvalidRequestError` naming ``field`` for an unknown kind, a missing or extra part,
        or a spec over the size limits (the content is checked by compiling it)."""
        if self.kind not in KINDS:
            raise InvalidRequestError(field, f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "choice":
            if not self.choices or self.text:
                raise InvalidRequestError(field, "a choice names its strings in choices (at least one), no text")
            if len(self.choices) > MAX_CHOICES:
                raise InvalidRequestError(field, f"at most {MAX_CHOICES} choices, got {len(self.choices)}")
        elif self.choices:
            raise InvalidRequestError(field, f"choices are for kind choice, not {self.kind}")
        elif self.kind == "json_object" and self.text:
            raise InvalidRequestError(field, "json_object takes no text (use json_schema for a schema)")
        elif self.kind not in ("json_object",) and not self.text:
            raise InvalidRequestError(field, f"{self.kind} needs its text")
        if any(token < 0 for token in self.starts_after_token_ids):
            raise InvalidRequestError(field, f"starts_after_token_ids must be token ids, got "
                                             f"{list(self.starts_after_token_ids)}")
        size = len(self.text) + sum(len(c) for c in self.choices)
        if size > MAX_SPEC_CHARS:
            raise InvalidRequestError(field, f"the spec is {size} characters, over the limit of {MAX_SPEC_CHARS}")
