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
    # Ling's (llama.cpp's BAILINGMOE; its possessive quantifiers made greedy, as llama.cpp has them)
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"),
                    (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]"""
                     r"""|\s+(?!\S)|\s+""",)),
}
