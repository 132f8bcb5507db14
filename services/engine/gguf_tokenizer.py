"""A GGUF file's tokenizer, converted once into a transformers tokenizer directory under
``$PDSERVE_CACHE_DIR/tokenizers`` (default ``~/.cache/pdserve``), keyed by the file's name, size and mtime:
building it from the file's metadata takes seconds.

transformers reads GGUF metadata only with torch importable. A process that runs no model (the gateway) keeps
torch out, so there the conversion runs once in a helper process, ``python -m services.engine.gguf_tokenizer FILE``,
which writes the same directory.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.engine.gguf_pre_splits import PRE_SPLITS
from services.engine.model.gguf_config import fields_as
from services.engine.model_files import cache_dir

GGUF_TOKENIZER_AS = {"granite": "llama", "granitemoe": "llama", "lfm2moe": "lfm2", "llama4": "llama",
                     "mistral3": "llama", "arcee": "llama", "gemma": "gemma2"}
"""llama.cpp architectures whose GGUF tokenizer transformers does not read by name, and the architecture whose reading
serves it: IBM Granite's, Llama 4's, Mistral 3's and Arcee's converters are llama's subclasses and write the same
``tokenizer.ggml.*`` fields (Llama 4's: a GPT-2-style BPE whose split, GPT-4o's, transformers takes from
``tokenizer.ggml.pre``; the kin only passes its architecture check); LFM2-MoE's writes LFM2's; Gemma 1's Gemma 2's
(the same SentencePiece fields)."""

READ_ALONE = frozenset({"deepseek2", "glm4", "glm4moe", "qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen3next", "smollm3",
                        "seed_oss", "olmo2", "olmoe", "ernie4_5", "ernie4_5-moe", "mistral4", "granitehybrid",
                        "nemotron_h", "nemotron_h_moe", "command-r", "cohere2", "exaone4", "hunyuan-dense",
                        "hunyuan-moe", "exaone", "dots1", "starcoder2", "nemotron", "phi2", "falcon-h1",
                        "jamba", "gptneox", "mamba", "mamba2"})
"""Architectures whose GGUF config transformers cannot read (DeepSeek's, GLM-4's, GLM-4.5's; the Qwen-VL text models',
named as no model type it knows; Qwen3-Next's, SmolLM3's, Seed-OSS's, OLMo's, ERNIE 4.5's, Mistral 4's, Granite 4.0's,
Nemotron-H's, Falcon-H1's, Jamba's, Mamba's and Mamba-2's, GPT-NeoX's, Cohere's, EXAONE's, Hunyuan's, dots.llm1's;
StarCoder2's, whose split transformers' GGUF reader would not take from its ``starcoder`` pre; Nemotron's, whose
``add_space_prefix`` it would not; Phi-2's): their tokenizer is built from its ``tokenizer.ggml.*`` fields alone, with
transformers' GGUF tokenizer builders, a byte-level one split as the file's ``tokenizer.ggml.pre`` says
(:data:`PRE_SPLITS` or transformers' own table; another is refused, whatever the architecture: :func:`_check_split`)."""

NO_BOS_PRES = frozenset({"glm4", "chatglm-bpe"})
"""Splits whose files name a BOS (GLM's ``[gMASK]``) that is never added, whatever ``add_bos_token`` says: the chat
template writes it, as GLM's own tokenizer has it (llama.cpp adds none to these files either: its converter writes
no ``add_bos_token``, which it then takes as false)."""


HELPER_TIMEOUT_S = 600.0


def converted_dir(path: Path) -> Path:
    """The tokenizer directory of the GGUF file ``path``, converting it first where it is not there yet."""
    directory = _directory_of(path)
    if not (directory / "tokenizer_config.json").is_file():
        from transformers.utils import is_torch_available

        if is_torch_available():
            _convert(path, directory)
        else:
            _convert_in_a_helper(path)
    return directory


CONVERSION_VERSION = 2
"""Part of a converted tokenizer's cache key: raised where a conversion changes (2: llama.cpp's splits for every
architecture, :mod:`services.engine.gguf_pre_splits`), so that no tokenizer converted before is served again."""


def _directory_of(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{CONVERSION_VERSION}:{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    key = key[:16]
    return cache_dir() / "tokenizers" / key


def _convert(path: Path, directory: Path) -> None:
    from transformers import AutoTokenizer
    from transformers.integrations.gguf import read_gguf_metadata

    _read_gguf_tokenizers_as_their_kin()
    metadata, _ = read_gguf_metadata(str(path))  # the scalar fields (arrays only counted): fast
    architecture, pre = str(metadata.get("general.architecture")), metadata.get("tokenizer.ggml.pre")
    model = metadata.get("tokenizer.ggml.model")
    _check_split(path, architecture, pre, model)
    if architecture in READ_ALONE:
        tokenizer = _tokenizer_alone(path, architecture, pre, model)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)  # GGUF: never custom code
    if model == "gpt2":  # a sentencepiece vocabulary splits nothing (its files name ``default``)
        _split_as(tokenizer, pre)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent))
    tokenizer.save_pretrained(str(staging))
    try:
        staging.rename(directory)
    except OSError:  # another process saved it first
        shutil.rmtree(staging, ignore_errors=True)


def _check_split(path: Path, architecture: str, pre: Any, model: Any) -> None:
    """A byte-level BPE's (``model`` ``gpt2``) split (``tokenizer.ggml.pre``) neither :data:`PRE_SPLITS` nor
    transformers knows is refused by name, as llama.cpp refuses it (``superbpe``, ``chameleon``, …): another split
    would give other tokens than the model's. A sentencepiece vocabulary splits nothing; a file naming no split
    (converted before llama.cpp wrote one) takes transformers' default, GPT-2's."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    if model == "gpt2" and pre is not None and pre not in PRE_SPLITS and pre not in GGUF_PRE_TOKENIZER_SPLITS:
        known = sorted({*PRE_SPLITS, *GGUF_PRE_TOKENIZER_SPLITS})
        raise ValueError(f"{path}: its tokenizer splits text as {pre!r} (tokenizer.ggml.pre), which pdserve does not "
                         f"know for a {architecture} file (known: {', '.join(known)}); tokenizing with another split "
                         "would give other tokens than the model's")


def _tokenizer_alone(path: Path, architecture: str, pre: Any, model: Any) -> Any:
    """The tokenizer of the file's ``tokenizer.ggml.*`` fields, built by transformers' GGUF tokenizer builders
    without reading the model's config (a sentencepiece one prefixed with a space as ``add_space_prefix`` says)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, fields, settings = get_gguf_tokenizer(str(path))
    if pre in NO_BOS_PRES:
        settings["add_bos_token"] = False
    backend, _ = convert_gguf_tokenizer(architecture, fields)
    if model == "llama" and fields.get("add_prefix_space") is False:
        _without_space_prefix(backend)
    return PreTrainedTokenizerFast(tokenizer_object=backend,
                                   **{key: value for key, value in settings.items() if value is not None})


def _without_space_prefix(backend: Any) -> None:
    """A sentencepiece vocabulary whose file says ``add_space_prefix`` false (ERNIE 4.5's, as its tokenizer has it):
    no ``▁`` before the text, and none taken off its decoding (transformers' builder adds both, its default)."""
    from tokenizers import decoders, pre_tokenizers

    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])


def _split_as(tokenizer: Any, pre: Any) -> None:
    """The pre-tokenizer of :data:`PRE_SPLITS` for the file's ``tokenizer.ggml.pre``, where it has one."""
    from tokenizers import Regex, pre_tokenizers

    splits = PRE_SPLITS.get(str(pre))
    if splits is None:
        return
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _convert_in_a_helper(path: Path) -> None:
    try:
        done = subprocess.run([sys.executable, "-m", "services.engine.gguf_tokenizer", str(path)],
                              capture_output=True, text=True, check=False, timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ValueError(f"{path}: reading its tokenizer from the GGUF metadata took over {HELPER_TIMEOUT_S:g} s"
                         ) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"{path}: its tokenizer could not be read from the GGUF metadata ({last})")


def _read_gguf_tokenizers_as_their_kin() -> None:
    """Lets transformers' GGUF readers take the architectures of :data:`GGUF_TOKENIZER_AS`: its legacy table of
    architectures gains each, with its kin's metadata names, and its config builders (the reader of the kin's own
    keys, such as LFM2's) one that reads the file's keys as its kin's; only the tokenizer is read from it here."""
    from transformers import modeling_gguf_pytorch_utils as gguf_reading
    from transformers.integrations.gguf import gguf_config_mapping

    names = gguf_reading.GGUF_TO_TRANSFORMERS_MAPPING["config"]
    builders = gguf_config_mapping.GGUF_CONFIG_ARCHS
    for architecture, kin in GGUF_TOKENIZER_AS.items():
        if architecture not in gguf_reading.GGUF_SUPPORTED_ARCHITECTURES and kin in names:
            names.setdefault(architecture, names[kin])
            gguf_reading.GGUF_SUPPORTED_ARCHITECTURES.append(architecture)
        if kin in builders and architecture not in builders:
            builders[architecture] = _as_kin(architecture, kin, builders[kin])


def _as_kin(architecture: str, kin: str, build: Callable[[dict, tuple], dict]) -> Callable[[dict, tuple], dict]:
    """``build`` (a config builder of transformers' for ``kin``'s files) over ``architecture``'s metadata, its
    ``{architecture}.*`` keys read as ``{kin}.*``."""
    def read(metadata: dict, tensor_names: tuple) -> dict:
        return build(fields_as(metadata, architecture, kin), tensor_names)

    return read


if __name__ == "__main__":  # the helper: converts here (torch importable), never through another helper
    _convert(Path(sys.argv[1]), _directory_of(Path(sys.argv[1])))
