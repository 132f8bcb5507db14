"""The gateway's process keeps torch out (``services.gateway.torch_free``): it reads the bundled model's
configuration and a GGUF tokenizer it never converted before (through the helper process) without torch, and
gets what a process with torch gets; ``--trust-remote-code`` (flag or variable), settings it cannot read and a
torch already imported leave torch importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.engine.model_files import bundled_model_path
from services.engine.tokenizer import Tokenizer
from services.engine.weights import load_model_config
from services.gateway.torch_free import keep_torch_out

BASE = ("--insecure", "--prefill", "127.0.0.1:9", "--decode", "127.0.0.1:10")
TEXT = "The gateway tokenizes: <|im_start|>user\nHi!<|im_end|>"

WITHOUT_TORCH = f"""
import json, sys
from services.gateway.torch_free import keep_torch_out
assert keep_torch_out({list(BASE)!r})
import services.gateway.main  # everything the gateway imports
from services.engine.model_files import bundled_model_path
from services.engine.tokenizer import Tokenizer
from services.engine.weights.model_config_reader import load_model_config
config = load_model_config(bundled_model_path())
tokenizer = Tokenizer.load(bundled_model_path(), config.eos_token_ids)
assert sys.modules["torch"] is None, "torch was imported"
print(json.dumps([repr(config), tokenizer.encode({TEXT!r}), tokenizer.decode(tokenizer.encode({TEXT!r}))]))
"""


def test_the_bundled_models_config_and_a_cold_gguf_tokenizer_are_read_without_torch_alike(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PDSERVE_WEIGHTS_CACHE_DIR"}  # the GGUF file itself
    env["PDSERVE_CACHE_DIR"] = str(tmp_path)  # no converted tokenizer yet: the helper process converts it
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    config, ids, text = json.loads(done.stdout.strip().splitlines()[-1])
    assert list((tmp_path / "tokenizers").iterdir()), "the helper saved the converted tokenizer"
    here = load_model_config(bundled_model_path())
    tokenizer = Tokenizer.load(bundled_model_path(), here.eos_token_ids)
    assert (config, ids, text) == (repr(here), tokenizer.encode(TEXT), tokenizer.decode(tokenizer.encode(TEXT)))


@pytest.fixture
def no_torch_yet(monkeypatch):
    """This process as a fresh gateway sees it (torch not imported); torch and the variables come back after."""
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delenv("PDSERVE_TRUST_REMOTE_CODE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_NO_ADVISORY_WARNINGS", raising=False)
    return monkeypatch


def test_torch_is_kept_out_by_default(no_torch_yet):
    assert keep_torch_out(BASE)
    assert sys.modules["torch"] is None
    assert os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] == "1"


@pytest.mark.parametrize("argv, variables", [
    ((*BASE, "--trust-remote-code"), {}),
    (BASE, {"PDSERVE_TRUST_REMOTE_CODE": "true"}),
    ((*BASE, "--no-such-flag"), {}),  # the gateway's own parse reports it
    (("--help",), {}),
])
def test_remote_code_and_settings_it_cannot_read_leave_torch_importable(no_torch_yet, capsys, argv, variables):
    for name, value in variables.items():
        no_torch_yet.setenv(name, value)
    assert not keep_torch_out(argv)
    assert "torch" not in sys.modules
    assert capsys.readouterr() == ("", ""), "the gateway's own parse speaks, not this one"


def test_a_torch_already_imported_stays(monkeypatch):
    import torch

    monkeypatch.delenv("TRANSFORMERS_NO_ADVISORY_WARNINGS", raising=False)
    assert not keep_torch_out(BASE)
    assert sys.modules["torch"] is torch


def test_every_family_s_config_reader_imports_without_torch():
    """The gateway reads any family's config (``config.json`` or a GGUF file's metadata) in its torch-free process:
    no family module (whose readers those are) may import torch, nor anything it imports (its model class and GGUF
    hook are imported by the processes that load weights only)."""
    code = f"""
import importlib, sys
from services.gateway.torch_free import keep_torch_out
assert keep_torch_out({list(BASE)!r})
from services.engine.model.registry import FAMILIES
for family in FAMILIES:
    importlib.import_module(family.module)
assert sys.modules["torch"] is None, "torch was imported"
print(len(FAMILIES))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) >= 30
