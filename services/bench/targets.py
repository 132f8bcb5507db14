"""Where a benchmark sends its requests: ``[name=]grpc://host:port`` (pdserve's gateway) or
``[name=]http://host:port`` (any OpenAI-compatible server), with an optional ``?logprobs=K`` (every token
with its logprob and the K most likely: two targets on the same server, with and without, measure what
logprobs cost in one run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from services.bench.datasets import BenchRequest
from services.bench.outcome import RequestOutcome

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
MAX_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 0.0
    ignore_eos: bool = True
    endpoint: str = "/v1/completions"  # OpenAI targets; "/v1/chat/completions" sends chat messages
    model: str = ""  # OpenAI targets; empty = the first model the server lists
    timeout_s: float = 600.0


@dataclass(frozen=True)
class TargetSpec:
    name: str
    url: str  # without the query
    logprobs: int | None = None  # ``?logprobs=K``: each request asks for K top logprobs per token

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def address(self) -> str:
        return urlsplit(self.url).netloc

    @classmethod
    def parse(cls, text: str) -> TargetSpec:
        """``name=url`` or ``url`` (then the name is the URL, query included)."""
        name, _, url = text.partition("=") if "=" in text.split("://")[0] else ("", "", text)
        parts = urlsplit(url)
        if parts.scheme not in ("grpc", "http", "https") or not parts.netloc:
            raise ValueError(f"target {text!r}: expected grpc://host:port or http(s)://host:port")
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(query) - {"logprobs"})
        if unknown:
            raise ValueError(f"target {text!r}: unknown option {unknown[0]!r} (known: logprobs)")
        logprobs = None
        if "logprobs" in query:
            value = query["logprobs"][-1]
            if not value.isdigit() or int(value) > MAX_LOGPROBS:
                raise ValueError(f"target {text!r}: logprobs must be an integer in [0, {MAX_LOGPROBS}], "
                                 f"got {value!r}")
            logprobs = int(value)
        return cls(name or url, parts._replace(query="", fragment="").geturl(), logprobs)


class Target(Protocol):
    """An open connection to a server; ``generate`` never raises for a failed request (the outcome
    says ``ok=False``)."""

    spec: TargetSpec

    async def generate(self, request: BenchRequest) -> RequestOutcome: ...

    async def close(self) -> None: ...


async def open_target(spec: TargetSpec, sampling: SamplingSpec) -> Target:
    if spec.scheme == "grpc":
        from services.bench.grpc_target import GrpcTarget

        return GrpcTarget(spec, sampling)
    from services.bench.openai_target import OpenAITarget

    return await OpenAITarget.open(spec, sampling)
