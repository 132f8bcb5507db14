"""``dns:///NAME:PORT`` entries: parsing, config validation, and the DNS watcher's answers (no servers)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from services.common.config import build_config
from services.gateway.config import GatewayConfig
from services.gateway.discovery import DnsEntry, DnsWatcher, node_address, parse_entry, system_resolver


def test_entries_parse_to_fixed_addresses_or_dns_names():
    assert parse_entry("10.0.0.1:50051", "decode") == "10.0.0.1:50051"
    assert parse_entry("[::1]:7", "decode") == "[::1]:7"
    entry = parse_entry("dns:///decode.pdserve.svc.cluster.local:50051", "decode")
    assert entry == DnsEntry("decode.pdserve.svc.cluster.local", 50051, "decode")
    assert entry.text == "dns:///decode.pdserve.svc.cluster.local:50051"


@pytest.mark.parametrize("entry", ["dns://10.0.0.10/decode:50051", "dns:decode:50051", "dns:///decode",
                                   "dns:///:50051", "dns:///decode:0", "dns:///decode:65536", "dns:///d:x",
                                   "decode", "decode:port"])
def test_a_bad_entry_is_named_in_the_error(entry):
    with pytest.raises(ValueError, match=f"bad entry {entry!r}"):
        parse_entry(entry, "decode")


def test_config_accepts_dns_entries_in_every_role_and_the_resolve_interval():
    config = build_config(GatewayConfig, ["--prefill", "dns:///prefill:50051", "--decode",
                                          "dns:///decode:50051,10.0.0.9:50051", "--cache-store",
                                          "dns:///store:50051", "--resolve-interval-s", "0.5"], env={})
    assert config.resolve_interval_s == 0.5
    assert config.nodes() == [("dns:///prefill:50051", "prefill"), ("dns:///decode:50051", "decode"),
                              ("10.0.0.9:50051", "decode"), ("dns:///store:50051", "cache_store")]
    assert GatewayConfig(prefill="p:1", decode="d:1").resolve_interval_s == 5.0


def test_config_errors_name_the_role_and_the_entry():
    with pytest.raises(ValueError, match=r"^decode: bad entry 'dns://ns/d:1'"):
        GatewayConfig(prefill="p:1", decode="dns://ns/d:1")
    with pytest.raises(ValueError, match=r"^cache_store: bad entry 'store'"):
        GatewayConfig(prefill="p:1", decode="d:1", cache_store="store")
    with pytest.raises(ValueError, match="listed twice"):
        GatewayConfig(prefill="dns:///n:1", decode="dns:///n:1")
    with pytest.raises(ValueError, match="resolve_interval_s"):
        GatewayConfig(prefill="p:1", decode="dns:///d:1", resolve_interval_s=0)


def test_node_addresses_bracket_ipv6():
    assert node_address("10.1.2.3", 50051) == "10.1.2.3:50051"
    assert node_address("fd00::1", 50051) == "[fd00::1]:50051"


async def test_the_system_resolver_answers_localhost():
    addresses = await system_resolver("localhost", 50051)
    assert addresses and set(addresses) <= {"127.0.0.1", "::1"}, addresses
    assert len(addresses) == len(set(addresses))


class ScriptedResolver:
    """Answers from ``answers[name]``: a list of IPs, an exception to raise, or "hang"."""

    def __init__(self, **answers: object) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        answer = self.answers[host.replace(".", "_")]
        if answer == "hang":
            await asyncio.sleep(60)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, list)
        return answer


async def test_the_watcher_keeps_the_last_good_answer_when_a_lookup_fails_is_empty_or_hangs():
    decode, store = DnsEntry("decode.test", 7, "decode"), DnsEntry("store.test", 8, "cache_store")
    resolver = ScriptedResolver(decode_test=["10.0.0.2", "fd00::1", "10.0.0.1", "10.0.0.2"],
                                store_test=OSError("Name or service not known"))
    watcher = DnsWatcher([decode, store], resolver, timeout_s=0.2)
    good = ("10.0.0.1:7", "10.0.0.2:7", "[fd00::1]:7")
    assert await watcher.resolve() == [(decode, good)]  # the store never resolved: no answer yet
    assert sorted(resolver.asked) == [("decode.test", 7), ("store.test", 8)]
    for failure in (OSError("temporary failure"), [], "hang"):
        resolver.answers["decode_test"] = failure
        assert await watcher.resolve() == [(decode, good)]
    resolver.answers.update(decode_test=["10.0.0.3"], store_test=["10.0.0.4"])
    assert await watcher.resolve() == [(decode, ("10.0.0.3:7",)), (store, ("10.0.0.4:8",))]
