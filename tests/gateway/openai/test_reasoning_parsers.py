"""The reasoning parsers (``--reasoning-parser qwen3 | deepseek_r1``): what ``split`` makes of a whole output,
and that a stream gives the same split for any chunking (cut at every position, in three pieces, one
character at a time), holding back text that may start a marker; the registry and the end marker's token."""

from __future__ import annotations

import pytest

from services.engine.tokenizer import Tokenizer
from services.gateway.openai.reasoning.markers import MarkerScanner, held_back_length
from services.gateway.openai.reasoning.registry import end_token_ids, reasoning_parser
from services.gateway.openai.reasoning.types import ReasoningParser, ReasoningSplit

QWEN3 = reasoning_parser("qwen3")
R1 = reasoning_parser("deepseek_r1")

# (text, qwen3's split, deepseek_r1's split)
CASES = [
    ("", ReasoningSplit(), ReasoningSplit()),
    ("Paris.", ReasoningSplit(content="Paris."), ReasoningSplit(reasoning="Paris.")),
    ("<think>\nhm, France\n</think>\n\nParis.", ReasoningSplit("\nhm, France\n", "Paris."),
     ReasoningSplit("\nhm, France\n", "Paris.")),
    ("<think></think>", ReasoningSplit(), ReasoningSplit()),
    ("<think></think>\n\n", ReasoningSplit(), ReasoningSplit()),
    ("<think>a</think>b</think>c", ReasoningSplit("a", "b</think>c"), ReasoningSplit("a", "b</think>c")),
    ("<think>a <think> b</think> c\n", ReasoningSplit("a <think> b", " c\n"), ReasoningSplit("a <think> b", " c\n")),
    ("<think>x</think>\r\n\n{\"a\": 1}\n", ReasoningSplit("x", "{\"a\": 1}\n"), ReasoningSplit("x", "{\"a\": 1}\n")),
    ("a < b and </ c </thin", ReasoningSplit(content="a < b and </ c </thin"),
     ReasoningSplit(reasoning="a < b and </ c </thin")),
    ("<thin", ReasoningSplit(content="<thin"), ReasoningSplit(reasoning="<thin")),
    ("<", ReasoningSplit(content="<"), ReasoningSplit(reasoning="<")),
    ("x<think>y", ReasoningSplit(content="x<think>y"), ReasoningSplit(reasoning="x<think>y")),
    ("é<think>🙂", ReasoningSplit(content="é<think>🙂"), ReasoningSplit(reasoning="é<think>🙂")),
]
# Outputs a Qwen3 stream cannot split as ``split`` does (it cannot wait for a "</think>" that may never
# come): an opened <think> never closed streams as reasoning, text before an unopened </think> as content.
QWEN3_STREAMED_OTHERWISE = [
    ("<think>cut short", ReasoningSplit(content="<think>cut short"), ReasoningSplit(reasoning="cut short")),
    ("<think>", ReasoningSplit(content="<think>"), ReasoningSplit()),
    ("<think>a</thi", ReasoningSplit(content="<think>a</thi"), ReasoningSplit(reasoning="a</thi")),
    ("thought</think>\n\nanswer", ReasoningSplit("thought", "answer"), ReasoningSplit(content="thoughtanswer")),
    ("</think>answer", ReasoningSplit("", "answer"), ReasoningSplit(content="answer")),
]
R1_ONLY = [
    ("thought</think>\n\nanswer", ReasoningSplit("thought", "answer")),
    ("<think>cut short", ReasoningSplit(reasoning="cut short")),
    ("<think>", ReasoningSplit()),
    ("</think>answer", ReasoningSplit("", "answer")),
    ("</think>", ReasoningSplit()),
]


def streamed(parser: ReasoningParser, pieces: list[str]) -> ReasoningSplit:
    stream = parser.stream()
    reasoning, content = "", ""
    for piece in [*pieces, None]:
        out = stream.feed(piece) if piece is not None else stream.finish()
        reasoning, content = reasoning + out.reasoning, content + out.content
    return ReasoningSplit(reasoning, content)


def chunkings(text: str) -> list[list[str]]:
    """Whole, one character at a time, cut once at every position, and cut twice at every pair of positions."""
    out = [[text], list(text)]
    out += [[text[:i], text[i:]] for i in range(len(text) + 1)]
    out += [[text[:i], text[i:j], text[j:]] for i in range(len(text) + 1) for j in range(i, len(text) + 1)]
    return out


@pytest.mark.parametrize(("text", "qwen3", "r1"), CASES)
def test_split_and_every_chunking_of_the_stream_agree(text, qwen3, r1):
    assert QWEN3.split(text) == qwen3
    assert R1.split(text) == r1
    for pieces in chunkings(text):
        assert streamed(QWEN3, pieces) == qwen3, pieces
        assert streamed(R1, pieces) == r1, pieces


@pytest.mark.parametrize(("text", "whole", "stream"), QWEN3_STREAMED_OTHERWISE)
def test_qwen3_streams_an_unfinished_or_unopened_thought_as_vllm_does(text, whole, stream):
    assert QWEN3.split(text) == whole
    for pieces in chunkings(text):
        assert streamed(QWEN3, pieces) == stream, pieces


@pytest.mark.parametrize(("text", "r1"), R1_ONLY)
def test_deepseek_r1_reads_its_output_as_inside_the_thought(text, r1):
    assert R1.split(text) == r1
    for pieces in chunkings(text):
        assert streamed(R1, pieces) == r1, pieces


def test_a_stream_holds_back_what_may_start_a_marker_and_releases_it_once_known():
    stream = QWEN3.stream()
    assert stream.feed("<thi") == ReasoningSplit()  # may open the thought
    assert stream.feed("nk>I am") == ReasoningSplit(reasoning="I am")
    assert stream.feed(" sure</th") == ReasoningSplit(reasoning=" sure")
    assert stream.feed("en") == ReasoningSplit(reasoning="</then")  # not the marker after all
    assert stream.feed("</think>\n") == ReasoningSplit()  # the answer's leading line breaks are dropped
    assert stream.feed("\nYes") == ReasoningSplit(content="Yes")
    assert stream.feed("\n</think>") == ReasoningSplit(content="\n</think>")  # after the end: plain text
    assert stream.finish() == ReasoningSplit()

    r1 = R1.stream()
    assert r1.feed("<") == ReasoningSplit()
    assert r1.feed("b") == ReasoningSplit(reasoning="<b")
    assert r1.feed("</") == ReasoningSplit()
    assert r1.finish() == ReasoningSplit(reasoning="</")

    plain = QWEN3.stream()  # no thought opened: content as it comes
    assert plain.feed("Hello") == ReasoningSplit(content="Hello")


def test_marker_scanner_and_held_back_length():
    assert held_back_length("abc</thi", "</think>") == 5
    assert held_back_length("abc<", "</think>") == 1
    assert held_back_length("abc", "</think>") == 0
    assert held_back_length("</think>", "</think>") == 0  # the whole marker is found, not held
    scanner = MarkerScanner("</think>")
    assert scanner.feed("x</").released == "x"
    scan = scanner.feed("think>y")
    assert (scan.released, scan.found, scan.after) == ("", True, "y")


def test_registry_names_the_choices():
    assert (QWEN3.name, R1.name) == ("qwen3", "deepseek_r1")
    assert QWEN3.end_marker == R1.end_marker == "</think>"
    with pytest.raises(ValueError, match="qwen3, deepseek_r1"):
        reasoning_parser("granite")


def test_the_end_marker_must_be_one_token(bundled_tokenizer):
    with pytest.raises(ValueError, match=r"--reasoning-parser qwen3 needs '</think>' to be one token"):
        end_token_ids(QWEN3, bundled_tokenizer)  # SmolLM2 spells it in several tokens


def test_the_end_marker_as_an_added_token_is_found(tmp_path, bundled_tokenizer):
    bundled_tokenizer.hf.save_pretrained(str(tmp_path))
    tokenizer = Tokenizer.load(tmp_path)
    tokenizer.hf.add_tokens(["<think>", "</think>"])
    (marker,) = end_token_ids(R1, tokenizer)
    assert marker == len(tokenizer.hf) - 1
    assert tokenizer.decode([marker], skip_special_tokens=False) == "</think>"


@pytest.mark.parametrize(("text", "_qwen3", "_r1"), CASES)
def test_glm45_splits_as_qwen3(text, _qwen3, _r1):
    """GLM-4.5's outputs open ``<think>`` themselves, as Qwen3's do: ``glm45`` (vLLM's name) is Qwen3's split."""
    glm = reasoning_parser("glm45")
    assert glm.name == "glm45" and glm.split(text) == QWEN3.split(text)


@pytest.mark.parametrize(("text", "_qwen3", "r1"), CASES + [(t, None, s) for t, s in R1_ONLY])
def test_minimax_m2_splits_as_deepseek_r1_and_seed_oss_with_its_own_markers(text, _qwen3, r1):
    """MiniMax-M2's template opens ``<think>`` in the prompt, as DeepSeek-R1's: ``minimax_m2`` is R1's split;
    ``seed_oss`` is R1's split of ``<seed:think>…</seed:think>``, in whole and streamed."""
    assert reasoning_parser("minimax_m2").split(text) == r1
    seed = reasoning_parser("seed_oss")
    seeded = text.replace("<think>", "<seed:think>").replace("</think>", "</seed:think>")
    want = ReasoningSplit(r1.reasoning.replace("<think>", "<seed:think>").replace("</think>", "</seed:think>"),
                          r1.content.replace("<think>", "<seed:think>").replace("</think>", "</seed:think>"))
    assert seed.split(seeded) == want
    for pieces in [[seeded], list(seeded), *([seeded[:i], seeded[i:]] for i in range(len(seeded) + 1))]:
        assert streamed(seed, pieces) == want, pieces
    assert seed.split(text.replace("<think>", "").replace("</think>", "")).content == ""  # no end: all thought


def _bracketed(text: str) -> str:
    return text.replace("<think>", "[THINK]").replace("</think>", "[/THINK]")


@pytest.mark.parametrize(("text", "qwen3", "_r1"), CASES)
def test_mistral_splits_as_qwen3_with_its_own_markers(text, qwen3, _r1):
    """Magistral opens ``[THINK]`` itself, as Qwen3 opens ``<think>``: ``mistral`` (vLLM's name) is Qwen3's split of
    ``[THINK]…[/THINK]``, in whole and streamed (its own markers held back as Qwen3's are)."""
    mistral = reasoning_parser("mistral")
    marked, want = _bracketed(text), ReasoningSplit(_bracketed(qwen3.reasoning), _bracketed(qwen3.content))
    assert mistral.name == "mistral" and mistral.markers == ("[THINK]", "[/THINK]")
    assert mistral.split(marked) == want
    for pieces in [[marked], list(marked), *([marked[:i], marked[i:]] for i in range(len(marked) + 1))]:
        assert streamed(mistral, pieces) == want, pieces


@pytest.mark.parametrize(("text", "whole", "stream"), QWEN3_STREAMED_OTHERWISE)
def test_mistral_streams_an_unfinished_or_unopened_thought_as_qwen3(text, whole, stream):
    mistral, marked = reasoning_parser("mistral"), _bracketed(text)
    assert mistral.split(marked) == ReasoningSplit(_bracketed(whole.reasoning), _bracketed(whole.content))
    for pieces in [[marked], list(marked)]:
        assert streamed(mistral, pieces) == ReasoningSplit(_bracketed(stream.reasoning), _bracketed(stream.content))


# A prompt that opened the reasoning (OpenedReasoning): the output begins inside it, whole and streamed alike,
# for a parser that reads unopened text as content (Qwen3's, Gemma 4's) as for one that reads it as reasoning
OPENED = [("thought{end}\n\nanswer", ReasoningSplit("thought", "answer")),
          ("cut short", ReasoningSplit(reasoning="cut short")),
          ("{end}answer", ReasoningSplit("", "answer")),
          ("", ReasoningSplit())]


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1", "gemma4", "mistral"])
@pytest.mark.parametrize(("text", "split"), OPENED)
def test_the_output_of_a_prompt_that_opened_the_reasoning_begins_in_it(name, text, split):
    from services.gateway.openai.reasoning.opened import OpenedReasoning

    opened = OpenedReasoning.of(reasoning_parser(name))
    text = text.format(end=opened.end_marker)
    assert opened.split(text) == split
    for pieces in chunkings(text):
        assert streamed(opened, pieces) == split, pieces


def test_an_opened_harmony_output_keeps_its_call_as_content():
    """A harmony turn of calls has no final channel (the end marker): what follows the analysis is still content."""
    from services.gateway.openai.reasoning.opened import OpenedReasoning

    call = "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
    assert OpenedReasoning.of(reasoning_parser("gpt_oss")).split("think more<|end|>" + call) == \
        ReasoningSplit("think more", call)
