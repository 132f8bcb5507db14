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

from services.engine.model_files import cache_dir

GGUF_TOKENIZER_AS = {"granite": "llama", "granitemoe": "llama", "lfm2moe": "lfm2", "llama4": "llama"}
"""llama.cpp architectures whose GGUF tokenizer transformers does not read by name, and the architecture whose
reading serves it: IBM Granite's and Llama 4's converters are llama's subclasses and write the same
``tokenizer.ggml.*`` fields (Llama 4's: a GPT-2-style BPE whose split, GPT-4o's, transformers takes from
``tokenizer.ggml.pre``; the kin only passes its architecture check); LFM2-MoE's writes LFM2's."""


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


def _directory_of(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "tokenizers" / key


def _convert(path: Path, directory: Path) -> None:
    from transformers import AutoTokenizer

    _read_gguf_tokenizers_as_their_kin()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)  # GGUF: never custom code
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent))
    tokenizer.save_pretrained(str(staging))
    try:
        staging.rename(directory)
    except OSError:  # another process saved it first
        shutil.rmtree(staging, ignore_errors=True)


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
        prefix = architecture + "."
        return build({kin + "." + key.removeprefix(prefix) if key.startswith(prefix) else key: value
                      for key, value in metadata.items()}, tensor_names)

    return read


if __name__ == "__main__":  # the helper: converts here (torch importable), never through another helper
    _convert(Path(sys.argv[1]), _directory_of(Path(sys.argv[1])))
