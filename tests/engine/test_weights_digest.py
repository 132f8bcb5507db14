"""The KV fingerprint depends on the weights' bytes: two models alike in name, shape and file sizes never
share KV (prefix caches, decode nodes and the cache-store compare it), the same weights always do."""

from __future__ import annotations

import shutil

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.random_llama import PRESETS, write_random_llama_dir
from services.engine.weights.digest import weights_digest


def _fingerprint(path) -> bytes:
    engine = LLMEngine.from_config(EngineConfig(model_path=str(path), dtype="float32", num_kv_blocks=8))
    return engine.fingerprint


def test_models_alike_but_for_their_weights_have_different_fingerprints(tmp_path):
    a = write_random_llama_dir(tmp_path / "a" / "model", PRESETS["tiny"], seed=0)
    b = write_random_llama_dir(tmp_path / "b" / "model", PRESETS["tiny"], seed=1)
    sizes = lambda path: sorted((f.name, f.stat().st_size) for f in path.iterdir())  # noqa: E731
    assert sizes(a) == sizes(b)  # same names, same sizes: only the bytes differ
    assert _fingerprint(a) != _fingerprint(b)


def test_the_same_weights_elsewhere_have_the_same_fingerprint(tmp_path):
    a = write_random_llama_dir(tmp_path / "a" / "model", PRESETS["tiny"], seed=0)
    copy = shutil.copytree(a, tmp_path / "copy")
    assert _fingerprint(a) == _fingerprint(copy)


def test_a_weight_file_under_another_name_has_the_same_digest(tmp_path):
    original = tmp_path / "model.gguf"
    original.write_bytes(b"GGUF" + bytes(range(256)) * 1000)
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(original, renamed)
    assert weights_digest(original) == weights_digest(renamed)
    renamed.write_bytes(original.read_bytes()[:-1] + b"\x00")
    assert weights_digest(original) != weights_digest(renamed)
