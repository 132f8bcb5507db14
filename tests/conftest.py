"""Shared fixtures: the real bundled model, loaded once per session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))


def _cluster_certificates() -> None:
    """The suite runs with internal mTLS on, as pdserve does by default: one CA for the session, a
    certificate per role under it (every process a test starts finds its own through $PDSERVE_MTLS_DIR),
    and this process holding every role (it plays gateway, prefill and decode nodes towards in-process
    servers; tests of the role checks use single-role identities from ``tests.tls_identities``)."""
    from services.common.tls.ca import ROLES, make_cluster_dir
    from services.common.tls.channels import set_identity
    from services.common.tls.identity import Identity

    root = Path(tempfile.mkdtemp(prefix="pdserve-test-mtls-"))
    atexit.register(shutil.rmtree, root, True)
    make_cluster_dir(root, {**{role: (role,) for role in ROLES}, "test": ROLES})
    os.environ["PDSERVE_MTLS_DIR"] = str(root)
    set_identity(Identity(root / "test"))


_cluster_certificates()


def _weights_cache() -> None:
    """The suite starts ~100 node processes of the bundled model: the first dequantises it, the others read
    the float32 tensors from a session cache (``services/engine/weights/gguf_cache.py``), seconds each."""
    if not os.environ.get("PDSERVE_WEIGHTS_CACHE_DIR"):
        root = tempfile.mkdtemp(prefix="pdserve-test-weights-")
        atexit.register(shutil.rmtree, root, True)
        os.environ["PDSERVE_WEIGHTS_CACHE_DIR"] = root


_weights_cache()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped (not failed) where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu); torch sees no CUDA device here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def bundled_model_path():
    from services.engine.model_files import bundled_model_path

    return bundled_model_path()


@pytest.fixture(scope="session")
def hf_bundled_model(bundled_model_path):
    """transformers' own load of the bundled GGUF, float32 (~20 s: loaded once for the session's references)."""
    from tests.engine.hf_reference import load_hf_model

    return load_hf_model(bundled_model_path)


@pytest.fixture(scope="session")
def bundled_weights(bundled_model_path):
    from services.engine.weights import load_weights

    return load_weights(bundled_model_path, keep_q4=True)


@pytest.fixture(scope="session")
def bundled_tokenizer(bundled_model_path, bundled_weights):
    from services.engine.tokenizer import Tokenizer

    return Tokenizer.load(bundled_model_path, bundled_weights.config.eos_token_ids)


@pytest.fixture(scope="session")
def fp32_model(bundled_weights):
    from services.engine.model.decoder import DecoderModel

    return DecoderModel(bundled_weights.config, bundled_weights.tensors, torch.float32)


def make_engine(model, tokenizer, remote_store=None, graph_capture=None, **overrides):
    """An engine over an already-loaded model (fresh KV pool and scheduler each time); ``remote_store``: the
    engine's cache-store factory (``offload_cache_store`` needs one); ``graph_capture``: decode graphs."""
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine

    settings = {"model_path": "<preloaded>", "dtype": "float32" if model.dtype == torch.float32 else "bfloat16",
                "num_kv_blocks": 512, "max_num_batched_tokens": 256}
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings), model, tokenizer, remote_store=remote_store,
                     graph_capture=graph_capture)


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory, bundled_tokenizer):
    """``family_dir(name)``: a tiny random checkpoint of a family of ``tests.engine.tiny_families``, built once
    per session."""
    from tests.engine.tiny_families import build_family

    root = tmp_path_factory.mktemp("families")
    built: dict = {}

    def get(name: str):
        if name not in built:
            built[name] = build_family(name, root, bundled_tokenizer.hf)
        return built[name]

    return get
