"""The dequantised-weights cache (``PDSERVE_WEIGHTS_CACHE_DIR``): a second load of a GGUF file reads the
entry the first wrote — same config, tensors and 4-bit codes — without opening the GGUF; ``keep_q4=False``
drops the codes; a damaged entry is ignored and rewritten; a rewritten file gets a new entry; without the
variable nothing is written; every family's config comes back whole from an entry."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from services.engine.model.registry import config_from_hf
from services.engine.weights import gguf_cache_config, gguf_loader, gguf_metadata, load_model_config, load_weights
from tests.engine.test_gguf_families import _write
from tests.engine.tiny_families import FAMILIES, SHAPE
from tests.engine.tiny_gguf import mixed


def _same(a, b) -> None:
    assert a.config == b.config
    assert a.tensors.keys() == b.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert a.quantized.keys() == b.quantized.keys()
    for name, q in a.quantized.items():
        other = b.quantized[name]
        assert q.group_size == other.group_size
        assert all(torch.equal(x, y) for x, y in ((q.codes, other.codes), (q.scales, other.scales),
                                                   (q.offsets, other.offsets)))


# experts (shared slices), rope scaling, Granite's scalars, Gemma 2's windows and caps
@pytest.mark.parametrize("family", ["qwen3_moe", "llama3-bias", "granite", "gemma2"])
def test_a_second_load_reads_the_entry_without_opening_the_file(family, tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache_config.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    _, path = _write(family, tmp_path, mixed)
    first = load_weights(path, keep_q4=True)
    assert first.quantized, "the mixed file has Q4 tensors"
    (entry,) = (tmp_path / "cache").iterdir()

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF file was opened although the cache holds it")

    monkeypatch.setattr(gguf_loader, "load_gguf", no_gguf)
    monkeypatch.setattr(gguf_metadata, "read_gguf_config", no_gguf)
    _same(first, load_weights(path, keep_q4=True))
    assert load_weights(path).quantized == {}, "keep_q4=False drops the codes"
    assert load_model_config(path) == first.config

    entry.write_bytes(entry.read_bytes()[:1000])  # damaged: loaded from the file again and rewritten
    monkeypatch.undo()
    monkeypatch.setenv(gguf_cache_config.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    _same(first, load_weights(path, keep_q4=True))
    assert entry.stat().st_size > 1000


def test_a_rewritten_file_gets_its_own_entry_and_no_variable_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache_config.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    _, path = _write("qwen3", tmp_path)
    before = load_weights(path)
    _write("qwen3", tmp_path, mixed)  # the same path, other bytes
    after = load_weights(path)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert not all(torch.equal(before.tensors[k], after.tensors[k]) for k in before.tensors)
    monkeypatch.delenv(gguf_cache_config.CACHE_DIR_VARIABLE)
    _, other = _write("qwen2", tmp_path)
    load_weights(other)
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_a_cached_load_reads_the_file_s_bytes_once_for_its_entry_and_its_identity(tmp_path, monkeypatch):
    """The entry's name and the engine's identity are the same digest: a node start hashes the file once (the
    gateway's start too, for its config and its identity)."""
    from services.engine.weights import digest as digest_module
    from services.engine.weights import gguf_cache
    from services.gateway import model_check

    monkeypatch.setenv(gguf_cache_config.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    _, path = _write("granite", tmp_path, mixed)
    hashed = []
    real = digest_module.weights_digest

    def counted(source):
        hashed.append(source)
        return real(source)

    for module in (gguf_cache, gguf_cache_config, digest_module):
        monkeypatch.setattr(module, "weights_digest", counted)
    loaded = load_weights(path)
    assert loaded.digest == real(path) and len(hashed) == 1
    hashed.clear()
    identity, config = model_check.model_identity(path)
    assert (identity.weights_digest, identity.name) == (loaded.digest, config.name) and len(hashed) == 1


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_s_config_comes_back_whole_from_an_entry(name):
    """An entry's config (``dataclasses.asdict`` as JSON) reads back as the config it was, each nested dataclass its
    class again (a field the reader does not rebuild would come back a dict)."""
    config = config_from_hf(_twin_config(name))
    assert gguf_cache_config.config_from_dict(json.loads(json.dumps(dataclasses.asdict(config)))) == config


def _twin_config(name: str) -> dict:
    """The ``config.json`` of the family's tiny twin (``tiny_families.build_family``'s, without its weights)."""
    from transformers import AutoConfig

    spec = dict(FAMILIES[name])
    model_type = spec.pop("model_type")
    ids = dict(vocab_size=1000, bos_token_id=1, eos_token_id=2)
    if spec.pop("per_layer_vocab", False):
        ids["vocab_size_per_layer_input"] = 1000
    if "text_config" in spec:
        spec["text_config"] = ids | SHAPE | spec["text_config"]
        return AutoConfig.for_model(model_type, **spec).to_dict()
    return AutoConfig.for_model(model_type, **ids, **(SHAPE | spec)).to_dict()
