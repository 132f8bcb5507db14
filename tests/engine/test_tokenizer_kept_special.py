"""Special tokens a parser reads (Mistral's ``[TOOL_CALLS]``, Llama 3's ``<|python_tag|>``) stay in the
decoded text once kept; every other special token is still dropped, and texts that are not one special
token of the vocabulary are ignored. The front keeps its parsers' markers at startup."""

from __future__ import annotations

import copy
import json

import pytest

from services.engine.tokenizer import Tokenizer
from services.gateway.openai.parsers import resolve_parsers


@pytest.fixture
def tokenizer(bundled_tokenizer) -> Tokenizer:
    """A copy of the bundled tokenizer whose vocabulary has Mistral's marker as a special token."""
    hf = copy.deepcopy(bundled_tokenizer.hf)
    hf.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    return Tokenizer(hf)


def test_a_kept_special_token_stays_in_the_text_and_the_others_do_not(tokenizer):
    marker = tokenizer.hf.convert_tokens_to_ids("[TOOL_CALLS]")
    im_start = tokenizer.hf.convert_tokens_to_ids("<|im_start|>")
    ids = [im_start, marker, *tokenizer.encode('[{"name": "f", "arguments": {}}]')]
    assert tokenizer.decode(ids) == '[{"name": "f", "arguments": {}}]'  # before: both dropped
    assert tokenizer.keep_special_tokens(["[TOOL_CALLS]", "[ARGS]", "hello"]) == ("[TOOL_CALLS]",)
    assert tokenizer.decode(ids) == '[TOOL_CALLS][{"name": "f", "arguments": {}}]'
    assert tokenizer.decode(ids, skip_special_tokens=False).startswith("<|im_start|>[TOOL_CALLS]")


def test_the_mistral_parser_keeps_its_marker_and_reads_the_calls(tokenizer):
    parsers = resolve_parsers("mistral", "", tokenizer)
    marker = tokenizer.hf.convert_tokens_to_ids("[TOOL_CALLS]")
    text = tokenizer.decode([marker, *tokenizer.encode('[{"name": "f", "arguments": {"a": 1}}]')])
    (call,) = parsers.tools.parse(text).calls
    assert call.name == "f" and json.loads(call.arguments) == {"a": 1}
