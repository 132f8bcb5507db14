"""A tokenizer class the model directory brings (``tokenizer_config.json``'s ``auto_map``, as Kimi K2's and
Moonlight's tiktoken tokenizers): refused, naming ``--trust-remote-code``, unless that flag is given; with it
the directory's own class runs. The flag reaches the tokenizer from the gateway, the nodes and the launcher."""

from __future__ import annotations

import json

import pytest

from services.cluster.__main__ import parse_spec
from services.common.config import build_config
from services.engine.tokenizer import Tokenizer, custom_tokenizer_class
from services.engine_node.node_config import EngineNodeConfig
from services.gateway.config import GatewayConfig

CLASS_FILE = '''
from transformers import PreTrainedTokenizerFast


class ShoutingTokenizer(PreTrainedTokenizerFast):
    """The bundled tokenizer, which upper-cases what it decodes: proof that this code ran."""

    def decode(self, *args, **kwargs):
        return super().decode(*args, **kwargs).upper()
'''


@pytest.fixture(scope="module")
def remote_code_dir(tmp_path_factory, bundled_tokenizer):
    root = tmp_path_factory.mktemp("remote_code_tokenizer")
    bundled_tokenizer.hf.save_pretrained(str(root))
    (root / "shouting.py").write_text(CLASS_FILE)
    config_path = root / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "shouting.ShoutingTokenizer"]}
    config["tokenizer_class"] = "ShoutingTokenizer"
    config_path.write_text(json.dumps(config))
    return root


def test_a_tokenizer_of_its_own_is_refused_naming_the_flag(remote_code_dir):
    assert custom_tokenizer_class(remote_code_dir) == "shouting.ShoutingTokenizer"
    with pytest.raises(ValueError, match="--trust-remote-code") as refused:
        Tokenizer.load(remote_code_dir)
    assert "shouting.ShoutingTokenizer" in str(refused.value)


def test_with_the_flag_the_directorys_class_runs(remote_code_dir, bundled_tokenizer):
    tokenizer = Tokenizer.load(remote_code_dir, trust_remote_code=True)
    assert type(tokenizer.hf).__name__ == "ShoutingTokenizer"
    ids = bundled_tokenizer.encode("Hello there")
    assert tokenizer.encode("Hello there") == ids
    assert tokenizer.decode(ids) == bundled_tokenizer.decode(ids).upper()


def test_a_plain_directory_needs_no_flag_nor_one_whose_class_transformers_has(tmp_path, bundled_tokenizer):
    bundled_tokenizer.hf.save_pretrained(str(tmp_path))
    assert custom_tokenizer_class(tmp_path) is None
    assert Tokenizer.load(tmp_path).encode("Hi") == bundled_tokenizer.encode("Hi")
    config_path = tmp_path / "tokenizer_config.json"  # an auto_map naming code, and a class transformers has
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": [None, "missing.Tokenizer"]},
                                       "tokenizer_class": "PreTrainedTokenizerFast"}))
    assert Tokenizer.load(tmp_path).encode("Hi") == bundled_tokenizer.encode("Hi")


def test_the_flag_reaches_every_process(tmp_path, monkeypatch):
    gateway = build_config(GatewayConfig, ["--prefill", "a:1", "--decode", "b:1", "--trust-remote-code"], env={})
    assert gateway.trust_remote_code is True
    node = build_config(EngineNodeConfig, ["--trust-remote-code"], env={})
    assert node.engine_config().trust_remote_code is True
    assert build_config(EngineNodeConfig, [], env={}).engine_config().trust_remote_code is False
    spec = parse_spec(["--trust-remote-code"])
    assert "--trust-remote-code" in spec.node_args("decode") and "--trust-remote-code" in spec.gateway_model_args()
    assert "--trust-remote-code" not in parse_spec([]).node_args("prefill")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    assert parse_spec(["--chat-template", "t.jinja"]).gateway_args == ("--chat-template", str(tmp_path / "t.jinja"))
    text = "{% for m in messages %}" + "x" * 400 + "{% endfor %}"  # longer than a file name can be
    assert parse_spec(["--chat-template", text]).gateway_args == ("--chat-template", text)
