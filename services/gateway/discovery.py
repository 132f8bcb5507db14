"""Finding nodes by DNS: ``dns:///NAME:PORT`` entries resolved, and re-resolved, into node addresses.

An entry of ``--prefill``/``--decode``/``--cache-store`` is either ``host:port`` (one fixed node) or
``dns:///NAME:PORT``: every address NAME resolves to (IPv4 and IPv6), each one node ``ip:PORT``
(``[ip]:PORT`` for IPv6). In Kubernetes NAME is a headless service, whose answer is the ready pods.

``DnsWatcher.resolve()`` asks the resolver about every entry and returns each entry's answer. An entry
whose lookup fails, times out or comes back empty keeps its last good answer (logged, not raised), so
a DNS hiccup never empties the cluster; an entry that never had a good answer has none yet.

The resolver is injectable: any ``async (host, port) -> addresses`` callable; the default asks the
system (``loop.getaddrinfo``). Tests pass a fake answer.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from services.common.ports import split_address

log = structlog.get_logger(__name__)

DNS_PREFIX = "dns:///"

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""``(host, port)`` → the IP addresses ``host`` resolves to now (raises ``OSError`` when it cannot)."""


@dataclass(frozen=True)
class DnsEntry:
    """One ``dns:///NAME:PORT`` entry of a role."""

    name: str
    port: int
    role: str

    @property
    def text(self) -> str:
        return f"{DNS_PREFIX}{self.name}:{self.port}"


def is_dns(entry: str) -> bool:
    return entry.startswith("dns:")


def parse_entry(entry: str, role: str) -> DnsEntry | str:
    """``dns:///NAME:PORT`` → ``DnsEntry``; ``host:port`` → itself. ``ValueError`` naming the entry."""
    if not is_dns(entry):
        try:
            split_address(entry)
        except ValueError:
            raise ValueError(f"bad entry {entry!r}: expected host:port or dns:///NAME:PORT") from None
        return entry
    if not entry.startswith(DNS_PREFIX):
        raise ValueError(f"bad entry {entry!r}: expected dns:///NAME:PORT (no DNS server authority)")
    name, sep, port = entry[len(DNS_PREFIX):].rpartition(":")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad entry {entry!r}: expected dns:///NAME:PORT with a port in 1..65535")
    return DnsEntry(name.strip("[]"), int(port), role)


def node_address(ip: str, port: int) -> str:
    """``ip:port``, IPv6 in brackets (a gRPC target)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives ``host`` (A and AAAA records, /etc/hosts), in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class DnsWatcher:
    def __init__(self, entries: Sequence[DnsEntry], resolver: Resolver | None = None,
                 timeout_s: float = 5.0) -> None:
        """``timeout_s`` bounds one lookup; a slower one counts as failed (the last answer stays)."""
        self.entries = tuple(entries)
        self.resolver = resolver or system_resolver
        self.timeout_s = timeout_s
        self._answers: dict[DnsEntry, tuple[str, ...]] = {}
        self._failures: dict[DnsEntry, str] = {}

    async def resolve(self) -> list[tuple[DnsEntry, tuple[str, ...]]]:
        """Look every entry up now (concurrently); each entry's node addresses, sorted. Entries that
        never resolved are left out."""
        await asyncio.gather(*(self._resolve(entry) for entry in self.entries))
        return [(entry, self._answers[entry]) for entry in self.entries if entry in self._answers]

    async def _resolve(self, entry: DnsEntry) -> None:
        try:
            ips = await asyncio.wait_for(self.resolver(entry.name, entry.port), self.timeout_s)
        except (OSError, asyncio.TimeoutError) as error:
            self._failed(entry, f"{type(error).__name__}: {error}")
            return
        addresses = tuple(sorted({node_address(ip, entry.port) for ip in ips}))
        if not addresses:
            self._failed(entry, "no addresses")
            return
        if self._failures.pop(entry, None) is not None:
            log.info("dns entry resolves again", entry=entry.text, role=entry.role)
        if addresses != self._answers.get(entry):
            log.info("dns answer", entry=entry.text, role=entry.role, addresses=addresses)
        self._answers[entry] = addresses

    def _failed(self, entry: DnsEntry, reason: str) -> None:
        """Keep the last good answer; warn once per distinct reason (then debug on each retry)."""
        kept = self._answers.get(entry, ())
        level = log.debug if self._failures.get(entry) == reason else log.warning
        level("dns lookup failed; keeping the last answer", entry=entry.text, role=entry.role, reason=reason,
              kept=kept)
        self._failures[entry] = reason
