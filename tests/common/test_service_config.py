"""build_config: flags override PDSERVE_* variables, which override defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from services.common.config import build_config, setting
from services.common.server_config import ServerConfig
from services.decode_node.config import DecodeNodeConfig
from services.gateway.config import GatewayConfig
from services.prefill_node.config import PrefillNodeConfig


@dataclass(frozen=True)
class Example:
    model_path: str
    num_blocks: int = setting(16, "blocks")
    ratio: float = 0.7
    enable_cache: bool = True
    port_file: Path | None = None
    max_len: int | None = None

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")


def test_defaults_env_and_flags_in_that_order():
    env = {"PDSERVE_MODEL_PATH": "/env/model", "PDSERVE_NUM_BLOCKS": "32", "PDSERVE_RATIO": "0.5"}
    config = build_config(Example, ["--num-blocks", "64"], env=env)
    assert config == Example(model_path="/env/model", num_blocks=64, ratio=0.5)


def test_types_bools_paths_and_none():
    env = {"PDSERVE_ENABLE_CACHE": "off", "PDSERVE_MAX_LEN": "2048"}
    config = build_config(Example, ["--model-path", "m", "--port-file", "/tmp/p", "--max-len", ""], env=env)
    assert config.enable_cache is False
    assert config.port_file == Path("/tmp/p")
    assert config.max_len is None  # the flag's empty string beats the variable
    assert build_config(Example, ["--model-path", "m", "--no-enable-cache"], env={}).enable_cache is False
    assert build_config(Example, ["--model-path", "m", "--enable-cache"], env=env).enable_cache is True


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--model-path (or PDSERVE_MODEL_PATH)"),
        (["--model-path", "m", "--num-blocks", "many"], {}, "--num-blocks: invalid literal"),
        (["--model-path", "m"], {"PDSERVE_ENABLE_CACHE": "maybe"}, "PDSERVE_ENABLE_CACHE: expected one of"),
        (["--model-path", "m", "--num-blocks", "0"], {}, "num_blocks must be >= 1"),
    ],
)
def test_bad_settings_are_usage_errors_naming_the_setting(argv, env, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_config(Example, argv, env=env)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_flag_is_its_whole_name_never_an_abbreviation(capsys):
    """``--port 50052`` once meant ``--port-file 50052``: the service wrote its port to a file named 50052 and
    listened on another."""
    with pytest.raises(SystemExit) as exit_info:
        build_config(PrefillNodeConfig, ["--port", "50052"], env={})
    assert exit_info.value.code == 2 and "unrecognized arguments: --port 50052" in capsys.readouterr().err


def test_server_config_validates_listen_and_logging(capsys):
    assert build_config(ServerConfig, [], env={"PDSERVE_LISTEN": "127.0.0.1:0"}).listen == "127.0.0.1:0"
    for argv in (["--listen", "nohost"], ["--log-level", "loud"], ["--log-format", "xml"]):
        with pytest.raises(SystemExit):
            build_config(ServerConfig, argv, env={})
    assert "listen: expected host:port" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--listen", "127.0.0.1:99999"], "listen: port must be 0-65535, got 99999"),  # was bound as 34463
    (["--metrics-listen", "127.0.0.1:70000"], "metrics_listen: port must be 0-65535, got 70000"),
    (["--max-message-mib", "0"], "max_message_mib must be >= 1, got 0"),
])
def test_server_config_refuses_ports_out_of_range_and_no_message_room(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_config(ServerConfig, argv, env={})
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    # each of these was accepted, then hung every request or failed it with a misleading status
    (["--max-num-batched-tokens", "0"], "max_num_batched_tokens must be >= 1, got 0"),
    (["--max-num-seqs", "0"], "max_num_seqs must be >= 1, got 0"),
    (["--threads", "-2"], "threads must be >= 0 (0: the default), got -2"),
    (["--num-kv-blocks", "-5"], "num_kv_blocks must be >= 0 (0: the default), got -5"),
    (["--kv-cache-gib", "0"], "kv_cache_gib must be > 0, got 0.0"),
    (["--max-model-len", "-1"], "max_model_len must be >= 0 (0: the default), got -1"),
    (["--block-size", "12"], "block_size must be a power of two, got 12"),
    (["--offload-host-gib", "-1"], "offload_host_gib must be >= 0, got -1.0"),
    (["--lease-ms", "0"], "lease_ms must be >= 1, got 0"),
    (["--state-checkpoints", "-2"], "state_checkpoints must be >= 0 (-1: the default), got -2"),
    (["--http-listen", "127.0.0.1:99999"], "http_listen: port must be 0-65535"),
])
def test_model_node_and_gateway_sizes_out_of_range_are_usage_errors(argv, message, capsys):
    assert build_config(DecodeNodeConfig, ["--kv-cache-gib", "0", "--num-kv-blocks", "64"], env={})  # unused: fine
    config, base = (GatewayConfig, ["--prefill", "127.0.0.1:1", "--decode", "127.0.0.1:2"]) \
        if argv[0] == "--http-listen" else (DecodeNodeConfig, [])
    with pytest.raises(SystemExit) as exit_info:
        build_config(config, base + argv, env={})
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_state_checkpoints_reach_the_engine_with_each_role_s_default():
    def engine(config, argv: list[str]):
        return build_config(config, argv, env={}).engine_config()

    # a prefill node computes the prompts: a quarter of max_num_seqs; a decode node only recomputes: none
    assert engine(PrefillNodeConfig, ["--max-num-seqs", "8"]).num_state_checkpoints == 2
    assert engine(PrefillNodeConfig, ["--state-checkpoints", "0"]).num_state_checkpoints == 0
    assert engine(DecodeNodeConfig, []).num_state_checkpoints == 0
    assert engine(DecodeNodeConfig, ["--state-checkpoints", "-1", "--max-num-seqs", "8"]).num_state_checkpoints == 2
    assert engine(DecodeNodeConfig, ["--state-checkpoints", "5"]).num_state_checkpoints == 5
