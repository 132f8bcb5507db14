"""The tiny chat family (tests/engine/tiny_chat_family.py): its tokenizer is the bundled one plus six marker
tokens, its template renders tools, an assistant's calls and tool results in Qwen3's shape, and the serving
stack loads it (the model's vocabulary is the tokenizer's)."""

from __future__ import annotations

import json

import pytest

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.sampling_params import SamplingParams
from services.engine.tokenizer import ChatMessage, Tokenizer, ToolCallRecord
from tests.engine.tiny_chat_family import MARKERS, build_chat_family

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, bundled_tokenizer):
    return build_chat_family(tmp_path_factory.mktemp("chat"), bundled_tokenizer.hf)


@pytest.fixture(scope="module")
def chat_tokenizer(chat_dir):
    return Tokenizer.load(chat_dir)


def test_the_markers_are_single_plain_tokens(chat_tokenizer, chat_dir, bundled_tokenizer):
    assert len(chat_tokenizer.hf) == len(bundled_tokenizer.hf) + len(MARKERS)
    assert json.loads((chat_dir / "config.json").read_text())["vocab_size"] == len(chat_tokenizer.hf)
    for marker in MARKERS:
        (marker_id,) = chat_tokenizer.hf.encode(marker, add_special_tokens=False)
        assert marker_id >= len(bundled_tokenizer.hf)
        assert chat_tokenizer.decode(chat_tokenizer.hf.encode(f"a{marker}b", add_special_tokens=False)) == \
            f"a{marker}b"  # not special: decoded text keeps it
    assert "<think>" not in bundled_tokenizer.hf.get_vocab()  # the bundled tokenizer is left as it was


def test_the_template_renders_tools_calls_and_results(chat_tokenizer):
    assert chat_tokenizer.template_takes_tools
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris and Lyon?"),
                ChatMessage("assistant", "", tool_calls=(ToolCallRecord("call_1", "get_weather", '{"city": "Paris"}'),
                                                         ToolCallRecord("call_2", "get_weather", '{"city": "Lyon"}'))),
                ChatMessage("tool", "sunny", tool_call_id="call_1"), ChatMessage("tool", "rain", tool_call_id="call_2")]
    text = chat_tokenizer.decode(chat_tokenizer.apply_chat_template(messages, tools=TOOLS), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n")
    assert f"<tools>\n{json.dumps(TOOLS[0])}\n</tools>" in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
            '<|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    plain = chat_tokenizer.decode(chat_tokenizer.apply_chat_template([ChatMessage("user", "Hi")]),
                                  skip_special_tokens=False)
    assert plain == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_the_engine_serves_it(chat_dir, chat_tokenizer):
    engine = LLMEngine.from_config(EngineConfig(model_path=str(chat_dir), dtype="float32", num_kv_blocks=64,
                                                max_num_batched_tokens=64))
    prompt = chat_tokenizer.apply_chat_template([ChatMessage("user", "Hi")], tools=TOOLS)
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 6 and all(0 <= t < len(chat_tokenizer.hf) for t in out.token_ids)


def test_a_forced_call_of_the_chat_family_writes_its_marker_tokens(chat_tokenizer):
    """The family's ``<tool_call>`` is an added token that is not special (as Qwen's is): a grammar's text
    ``<tool_call>`` may be written with it, and every random completion the masks allow parses as a call."""
    import numpy as np

    from services.engine.structured.compiler import StructuredCompiler
    from services.engine.structured_spec import StructuredSpec
    from services.gateway.openai.tools.hermes import HermesParser
    from services.gateway.openai.tools.types import ToolSpec

    tool = ToolSpec("add", "a + b", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    parser = HermesParser()
    compiler = StructuredCompiler(chat_tokenizer, len(chat_tokenizer.hf))
    grammar = compiler.compile(StructuredSpec("grammar", parser.forced_grammar([tool], parallel=False)))
    (open_id,) = chat_tokenizer.hf.encode("<tool_call>", add_special_tokens=False)
    rng = np.random.default_rng(0)
    used_marker = False
    for _ in range(8):
        matcher, out = grammar.new_matcher(), []
        while not matcher.is_stopped() and len(out) < 200:
            mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
            allowed = np.nonzero(np.unpackbits(mask, bitorder="little")[:len(chat_tokenizer.hf)])[0]
            token = int(rng.choice(allowed))
            assert matcher.consume_token(token), matcher.get_error()
            out.append(token)
        used_marker |= open_id in out
        (call,) = parser.parse(chat_tokenizer.decode(out)).calls
        assert call.name == "add" and isinstance(json.loads(call.arguments)["a"], int)
    assert used_marker
