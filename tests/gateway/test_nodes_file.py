"""``--nodes-file``: the gateway takes its node entries from a JSON file a launcher writes once its nodes serve
(services/gateway/nodes_file.py), waiting for it; the entries are checked as the flags' are; a bad file, a missing
one past the timeout, or entries both in a file and in flags are refused by name."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.gateway.config import GatewayConfig
from services.gateway.nodes_file import read_nodes_file, with_nodes_file, write_nodes_file


def test_the_entries_come_from_the_file_once_it_is_written(tmp_path):
    path = tmp_path / "nodes.json"
    config = GatewayConfig(nodes_file=path, nodes_file_timeout_s=5)
    assert config.nodes() == []  # nothing yet: checked once read

    async def later():
        await asyncio.sleep(0.2)
        write_nodes_file(path, "127.0.0.1:1,127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4")

    async def both():
        _, got = await asyncio.gather(later(), with_nodes_file(config))
        return got

    got = asyncio.run(both())
    assert got.nodes_file is None
    assert (got.prefill_addresses, got.decode_addresses, got.cache_store_addresses) == (
        ("127.0.0.1:1", "127.0.0.1:2"), ("127.0.0.1:3",), ("127.0.0.1:4",))
    assert asyncio.run(with_nodes_file(got)) is got  # no file: the config as it is


def test_a_file_s_entries_are_checked_as_the_flags_are(tmp_path):
    path = tmp_path / "nodes.json"
    write_nodes_file(path, "127.0.0.1:1", "")
    with pytest.raises(ValueError, match="decode: at least one decode node address is required"):
        asyncio.run(with_nodes_file(GatewayConfig(nodes_file=path)))


@pytest.mark.parametrize(("text", "named"), [
    ("not json", "is not readable JSON"),
    (json.dumps(["127.0.0.1:1"]), "must be an object of prefill, decode, cache_store"),
    (json.dumps({"prefill": "a:1", "decoder": "b:2"}), "must be an object"),
    (json.dumps({"prefill": ["a:1"]}), "must be an object"),
])
def test_a_bad_file_is_refused_naming_it(tmp_path, text, named):
    path = tmp_path / "nodes.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=named):
        read_nodes_file(path)


def test_no_file_in_time_and_entries_in_both_places_are_refused(tmp_path):
    with pytest.raises(TimeoutError, match=r"no .*nodes\.json after 0\.1 s"):
        asyncio.run(with_nodes_file(GatewayConfig(nodes_file=tmp_path / "nodes.json", nodes_file_timeout_s=0.1)))
    with pytest.raises(ValueError, match="in the file or as flags, not both"):
        GatewayConfig(nodes_file=tmp_path / "nodes.json", prefill="127.0.0.1:1")
