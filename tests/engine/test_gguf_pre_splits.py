"""A GGUF file's byte-level vocabulary splits text as llama.cpp splits it for its ``tokenizer.ggml.pre``, whatever the
architecture (here ``llama``, whose tokenizer transformers reads): the splits transformers does not know come from
``PRE_SPLITS`` (llama.cpp's regexes applied in turn), and one neither knows is refused by name, as llama.cpp refuses
it, rather than tokenized by another split."""

from __future__ import annotations

import pytest

from services.engine.gguf_pre_splits import PRE_SPLITS
from tests.engine.tiny_gguf import write_bpe_tokenizer_gguf

_KEYS = {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8,
         "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-5}
TEXT = "Granite's 2026 sum: 12345+67, (done)\n\n  x!"


def _pieces(tmp_path, monkeypatch, bundled_tokenizer, pre: str, text: str = TEXT) -> list[str]:
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_bpe_tokenizer_gguf(tmp_path / f"{pre}.gguf", "llama", _KEYS, pre, bundled_tokenizer.hf)
    loaded = Tokenizer.load(path)
    assert loaded.decode(loaded.encode_plain(text)) == text
    return [piece for piece, _ in loaded.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]


def _split(pre: str, text: str) -> list[str]:
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS[pre]]
                                    + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return [piece for piece, _ in split.pre_tokenize_str(text)]


def test_a_llama_file_s_split_is_the_table_s(tmp_path, monkeypatch, bundled_tokenizer):
    """transformers reads a ``llama`` file's tokenizer and knows no ``refact`` (IBM Granite 3's files): the table's
    split is set after."""
    assert _pieces(tmp_path, monkeypatch, bundled_tokenizer, "refact") == _split("refact", TEXT)


@pytest.mark.parametrize(("pre", "pieces"), [
    # IBM Granite 3's (llama.cpp's STARCODER group): every digit apart, then GPT-2's split (a punctuation run
    # whole, line ends with the space after them)
    ("refact", ["Granite", "'s", "Ġ", "2", "0", "2", "6", "Ġsum", ":", "Ġ", "1", "2", "3", "4", "5", "+", "6", "7", ",",
                "Ġ(", "done", ")", "ĊĊĠ", "Ġx", "!"]),
    # GPT-2's own: digits in runs, a space joined to the run after it
    ("gpt-2", ["Granite", "'s", "Ġ2026", "Ġsum", ":", "Ġ12345", "+", "67", ",", "Ġ(", "done", ")", "ĊĊĠ", "Ġx",
               "!"]),
    # llama.cpp's default: punctuation runs apart, GPT-2's split, digit runs, then runs of three digits
    ("default", ["Granite", "'", "s", "Ġ", "202", "6", "Ġsum", ":", "Ġ", "123", "45", "+", "67", ",", "Ġ", "(",
                 "done", ")", "ĊĊĠ", "Ġx", "!"]),
    # Qwen2's group (StableLM 2's here): digits apart, a punctuation run with the line ends after it
    ("stablelm2", ["Granite", "'s", "Ġ", "2", "0", "2", "6", "Ġsum", ":", "Ġ", "1", "2", "3", "4", "5", "+", "6", "7",
                   ",", "Ġ(", "done", ")ĊĊ", "Ġ", "Ġx", "!"]),
])
def test_a_split_transformers_does_not_know_is_llama_cpp_s(pre, pieces):
    assert _split(pre, TEXT) == pieces


def test_deepseek_llm_s_split_is_its_own_letters_punctuation_and_digit_runs():
    """DeepSeek LLM's (DeepSeek-V2's files too): line ends apart, letter runs and punctuation runs each with the space
    before them, digit runs whole; its letters are its listed ranges, exactly: U+212A (the Kelvin sign; written as
    ASCII K, a range from it would take in «), Greek, Armenian capitals but not its lower case, CJK runs apart."""
    from tokenizers import pre_tokenizers

    def byte_level(pieces: list[str]) -> list[str]:
        to_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return [to_bytes.pre_tokenize_str(piece)[0][0] for piece in pieces]

    assert _split("deepseek-llm", TEXT) == byte_level([
        "Granite", "'", "s", " ", "2026", " sum", ":", " ", "12345", "+", "67", ",", " (", "done", ")", "\n", "\n", " ",
        " x", "!"])
    assert _split("deepseek-llm", "\u212a\u00abαβ, Ա ա 中文！") == byte_level(
        ["\u212a", "\u00ab", "αβ", ",", " Ա", " ա ", "中文", "！"])
    # ASCII letters fall in its punctuation class too (':' to '~'), so a letter run mixing them with others splits
    # there; and its CJK class (U+0800 to U+4E00) isolates the other five of the six escaped letters whatever the letter
    # class says, as llama.cpp splits them
    assert _split("deepseek-llm", "aβc") == byte_level(["a", "β", "c"])
    assert _split("deepseek-llm", "α\u2126β") == byte_level(["α", "\u2126", "β"])


def test_every_split_of_the_table_compiles():
    from tokenizers import Regex

    for pre, splits in PRE_SPLITS.items():
        for regex in splits:
            assert Regex(regex) is not None, pre


def test_the_bundled_model_splits_as_smollm2_s_own_tokenizer(bundled_model_path, tmp_path, monkeypatch):
    """SmolLM2's file says ``smollm`` (llama.cpp's STARCODER group), which transformers does not know: split as its
    tokenizer.json splits (every digit apart, then GPT-2's byte-level split), not by GPT-2's alone, which keeps
    digits together where its vocabulary has no such merges."""
    from tokenizers import pre_tokenizers

    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    own = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    ours = Tokenizer.load(bundled_model_path).hf.backend_tokenizer.pre_tokenizer
    for text in ("x  12\n\n 7", "Year 2026: 12,345.67 apples", "a1b22 c333\t\t4444 ", "  lead, 90%!\n"):
        assert [p for p, _ in ours.pre_tokenize_str(text)] == [p for p, _ in own.pre_tokenize_str(text)], text


def test_a_split_no_one_knows_is_refused_for_every_architecture(tmp_path, monkeypatch, bundled_tokenizer):
    from services.engine.tokenizer import Tokenizer

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_bpe_tokenizer_gguf(tmp_path / "superbpe.gguf", "llama", _KEYS, "superbpe", bundled_tokenizer.hf)
    with pytest.raises(ValueError, match=r"splits text as 'superbpe'.*for a llama file"):
        Tokenizer.load(path)
