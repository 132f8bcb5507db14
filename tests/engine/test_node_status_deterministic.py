"""A model node reports its numerics mode: ``NodeStatus.deterministic`` is the engine's ``--deterministic``
(the gateway leaves out a node whose mode differs from its own)."""

from __future__ import annotations

import pytest

from services.engine_node.status import node_status
from tests.conftest import make_engine


@pytest.mark.parametrize("deterministic", [False, True])
def test_node_status_carries_the_engines_mode(fp32_model, bundled_tokenizer, deterministic):
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16, deterministic=deterministic)
    stats = engine.stats()
    assert stats.deterministic is deterministic
    for role in ("prefill", "decode"):
        assert node_status(stats, role, "127.0.0.1:1").deterministic is deterministic


def test_output_caching_is_refused_in_the_deterministic_mode():
    """Cached outputs would serve blocks of output positions as a later prompt's prefix (other numbers)."""
    from services.engine.config import EngineConfig

    with pytest.raises(ValueError, match=r"cache_outputs .* deterministic mode"):
        EngineConfig(model_path="m.gguf", offload_cache_store="127.0.0.1:1", cache_outputs=True, deterministic=True)
    assert EngineConfig(model_path="m.gguf", offload_cache_store="127.0.0.1:1", cache_outputs=True).cache_outputs


def test_deterministic_kv_is_keyed_by_the_kernels_that_computed_it(fp32_model, bundled_tokenizer, monkeypatch):
    """Nodes whose kernels differ (AMX or not, another build or torch) give rows other bits: their KV layouts
    (and prefix-cache keys) differ, so they neither pair for a handoff nor share cached blocks."""
    import kernels.signature as signature

    default = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16)
    here = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16, deterministic=True)
    again = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16, deterministic=True)
    assert here.fingerprint == again.fingerprint != default.fingerprint
    amx_here = signature.amx_supported()
    monkeypatch.setattr(signature, "amx_supported", lambda: not amx_here)
    other_cpu = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16, deterministic=True)
    assert other_cpu.fingerprint not in (here.fingerprint, default.fingerprint)
    assert "|amx " in signature.deterministic_kernels("cpu")
