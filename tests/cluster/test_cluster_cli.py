"""``python -m services.cluster --model PATH`` and ``make run MODEL=PATH`` give the model (and the served
name and context length) to every process: the gateway and each prefill and decode node."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from services.cluster.__main__ import parse_spec
from services.cluster.local import ClusterSpec, key_metadata

REPO = Path(__file__).resolve().parents[2]


def test_the_model_and_its_settings_reach_the_gateway_and_every_node(tmp_path):
    model = tmp_path / "my model"
    model.mkdir()
    spec = parse_spec(["--model", str(model), "--served-model-name", "mine", "--max-model-len", "512"])
    assert spec.model == str(model)
    for role in ("prefill", "decode"):
        args = spec.node_args(role)
        assert args[:4] == ("--model", str(model), "--max-model-len", "512")
        assert "--served-model-name" not in args
    assert spec.gateway_model_args() == ("--model", str(model), "--max-model-len", "512",
                                         "--served-model-name", "mine")


def test_without_a_model_every_process_loads_the_bundled_one():
    spec = parse_spec([])
    assert spec.node_args("decode") == ("--dtype", "bfloat16", "--threads", "1")
    assert spec.gateway_model_args() == ()
    assert ClusterSpec(engine_args=("--dtype", "float32"), prefill_args=("--x",)).node_args("prefill") == (
        "--dtype", "float32", "--x")


def test_a_relative_model_path_is_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert parse_spec(["--model", "m.gguf"]).model == str(tmp_path / "m.gguf")


@pytest.mark.parametrize(("argv", "complaint"), [
    (["--model", "/no/such/model"], "--model /no/such/model: no such file or directory"),
    (["--max-model-len", "-1"], "--max-model-len must be >= 0"),
])
def test_bad_flags_are_usage_errors(argv, complaint, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_spec(argv)
    assert exit_.value.code == 2 and complaint in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_run_passes_model_served_name_and_context_length():
    def run_line(*variables: str) -> str:
        text = subprocess.run(["make", "-n", "run", *variables], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout
        (line,) = [x for x in text.replace("\\\n", " ").splitlines() if "-m services.cluster" in x]
        return " ".join(line.split())

    assert run_line("MODEL=/models/my model", "SERVED_MODEL_NAME=mine", "MAX_MODEL_LEN=512").endswith(
        "-m services.cluster --model '/models/my model' --served-model-name 'mine' --max-model-len 512")
    assert run_line().endswith("-m services.cluster")
    assert run_line("RUN_ARGS=--decode-nodes 2").endswith("-m services.cluster --decode-nodes 2")


def test_an_api_key_reaches_the_spec_from_the_flag_or_the_variable_and_stays_out_of_its_repr(monkeypatch):
    monkeypatch.delenv("PDSERVE_API_KEY", raising=False)
    assert parse_spec([]).api_key == ""
    assert parse_spec(["--api-key", "sk-flag"]).api_key == "sk-flag"
    monkeypatch.setenv("PDSERVE_API_KEY", "sk-env,sk-other")
    spec = parse_spec([])
    assert spec.api_key == "sk-env,sk-other" and "sk-env" not in repr(spec)
    assert key_metadata(spec.api_key) == (("authorization", "Bearer sk-env"),) and key_metadata("") is None
