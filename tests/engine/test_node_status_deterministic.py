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
