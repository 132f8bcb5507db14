"""The splits of byte-level GGUF vocabularies transformers' GGUF reader does not know, by ``tokenizer.ggml.pre``: the
regexes that split the text in turn (each match isolated, each later one splitting the pieces of the earlier), before
the byte-level map, as llama.cpp's ``llm_tokenizer_bpe`` applies its ``regex_exprs`` (``src/llama-vocab.cpp``; its
``(?:'[sS]|…)`` written here as the ``(?i:'s|…)`` of the tokenizer.json it stands for). A split neither this table nor
transformers knows is refused (:mod:`services.engine.gguf_tokenizer`), as llama.cpp refuses one.
"""

from __future__ import annotations

# GPT-2's own split (llama.cpp's GPT2 group: its trailing ``\s+`` changes no piece, a whitespace run no other
# alternative takes being a piece of its own there too)
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Qwen2's (llama.cpp's QWEN2 group: StableLM 2, Hunyuan, Solar Open, Grok 2 too)
_QWEN2 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
          r"""|\s+(?!\S)|\s+""")
# GPT-4's cl100k (llama.cpp's LLAMA3, DBRX, SMAUG and CHATGLM4 groups)
_CL100K = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# BLOOM's, Poro's, GPT-3-Finnish's: anything but whitespace and these marks, with a space before
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

# DeepSeek LLM's letters: the ranges of cased letters its tokenizer.json lists (not all of Unicode's: Armenian lower
# case is not among them), as llama.cpp copies them; written as escapes, since several (U+1F7D, U+1FBE, U+1FD3, U+1FDB,
# U+2126, U+212A) have canonical equivalents an editor or a normalising copy would silently swap in
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    "\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    "\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943")

PRE_SPLITS: dict[str, tuple[str, ...]] = {
    # DeepSeek-V3's (and R1's, V3.1's …; Hunyuan dense's, the same llama.cpp case): groups of up to three digits,
    # then runs of CJK ideographs and kana, then its GPT-4-like split, each isolated in turn (llama.cpp's
    # LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM, as its tokenizer.json has them)
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense"), (
        r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
        r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")),
    # GLM-4's (GLM-4-0414, 4.5, 4.6, 4.7, 4.7-Flash): GPT-4's cl100k split, as its tokenizer.json has it (llama.cpp's
    # LLAMA_VOCAB_PRE_TYPE_CHATGLM4)
    "glm4": (_CL100K,),
    # Seed-Coder's (and Seed-OSS's where its file names it): GPT-4's split but digits one by one and punctuation
    # runs without line ends (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SEED_CODER)
    "seed-coder": (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+"""
                   r"""|\s*[\r\n]+|\s+(?!\S)|\s+""",),
    # Kimi K2's: the tiktoken pattern of its tokenization_kimi.py (runs of Han apart; letters as GPT-4o's split
    # them, Han excepted, by Oniguruma's class intersection)
    "kimi-k2": (r"""[\p{Han}]+"""
                r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
                r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
                r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
                r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
                r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",),
    # GPT-2's split alone (llama.cpp's GPT2, MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING): OLMoE's ``olmo`` and others
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo",
                     "jais", "trillion", "granite-docling"), (_GPT2,)),
    # every digit apart, then GPT-2's (llama.cpp's STARCODER group: IBM Granite 3's ``refact``, SmolLM's ``smollm``)
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
                    (r"\p{N}", _GPT2)),
    # llama.cpp's own default for a file that names ``default``: punctuation runs, GPT-2's, digit runs, threes
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    **dict.fromkeys(("stablelm2", "hunyuan", "solar-open", "grok-2"), (_QWEN2,)),
    "chatglm-bpe": (_CL100K,),
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), (_BLOOM,)),
    "viking": (_BLOOM, r"\p{N}"),
    # DeepSeek-Coder's: line ends, letter runs, punctuation runs (each with a space before), CJK and Hangul runs, digits
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                       r"\p{N}"),
    # DeepSeek LLM's (7B, 67B; DeepSeek-V2, V2-Lite, V2.5 and Coder-V2 files name it too): line ends, runs of its
    # letters and of ASCII, full-width and CJK punctuation (each with a space before), whitespace ending a piece, CJK
    # and Hangul runs, digit runs (llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM)
    "deepseek-llm": ("[\r\n]", "\\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$",
                     "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}+"),
    # Ling's (llama.cpp's BAILINGMOE; its possessive quantifiers made greedy, as llama.cpp has them)
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"),
                    (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]"""
                     r"""|\s+(?!\S)|\s+""",)),
}
