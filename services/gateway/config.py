"""Gateway settings: ``--flag`` or ``PDSERVE_*`` variable per field (see services.common.config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from services.common.config import setting
from services.common.server_config import ServerConfig, check_host_port
from services.gateway.discovery import parse_entry
from services.gateway.nodes import CACHE_STORE, DECODE, PREFILL
from services.gateway.router import ROUTING_POLICIES

# services/gateway/openai/tools/
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral", "gpt_oss", "openai", "glm45", "glm47",
                     "qwen3_coder", "deepseek_v3", "deepseek_v31", "kimi_k2", "minimax_m2", "seed_oss", "gemma4")
REASONING_PARSERS = ("qwen3", "deepseek_r1", "gpt_oss", "openai_gptoss", "glm45", "minimax_m2",
                     "seed_oss", "mistral", "gemma4")  # services/gateway/openai/reasoning/


def split_addresses(text: str) -> tuple[str, ...]:
    """``"a:1, b:2"`` → ``("a:1", "b:2")``; empty → ``()``."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class GatewayConfig(ServerConfig):
    """pdserve gateway: validates, tokenizes, routes each request to a prefill and a decode node, streams
    the tokens back."""

    listen: str = setting("127.0.0.1:50051", "host:port to serve on; port 0 = ephemeral")
    prefill: str = setting("", "prefill nodes, comma-separated host:port or dns:///NAME:PORT entries (required)")
    decode: str = setting("", "decode nodes, comma-separated host:port or dns:///NAME:PORT entries (required)")
    cache_store: str = setting("", "cache-stores, comma-separated host:port or dns:///NAME:PORT entries "
                                   "(listed in ClusterStatus)")
    resolve_interval_s: float = setting(5.0, "seconds between lookups of the dns:/// entries")
    model: Path | None = setting(None, "GGUF file or HF directory (tokenizer and config only); "  # noqa: RUF009
                                       "default: the bundled SmolLM2-135M")
    trust_remote_code: bool = setting(False, "run a tokenizer class the model directory brings (its "
                                             "tokenizer_config.json's auto_map: Kimi K2, Moonlight); off: refused")
    chat_template: str = setting("", "the chat template to render conversations with instead of the model's own "
                                     "(a Jinja file, or its text): for a model without one or with a broken one; "
                                     "empty = the model's")
    max_model_len: int = setting(0, "context length; 0 = the model's")
    deterministic: bool = setting(False, "this cluster serves in batch-invariant mode: a prefill or decode node "
                                         "whose --deterministic differs from this is left out (unhealthy, "
                                         "never routed to); start the gateway and every node in one mode")
    default_max_tokens: int = setting(256, "max_tokens when a request sets none (capped by the context)")
    generation_config: str = setting("auto", "auto: the sampling fields of the model directory's "
                                             "generation_config.json (temperature, top_p, top_k, min_p, "
                                             "repetition_penalty) are the defaults of requests that leave them "
                                             "unset, as vLLM does; none: pdserve's own defaults")
    request_timeout_s: float = setting(0.0, "deadline for calls that carry none; 0 = none")
    poll_interval_s: float = setting(0.5, "seconds between NodeStatus polls of every node")
    status_timeout_s: float = setting(1.0, "NodeStatus call timeout; no answer = unhealthy")
    status_max_age_s: float = setting(1.0, "ClusterStatus polls again when the last poll is older")
    abort_timeout_s: float = setting(2.0, "timeout of the best-effort Abort calls")
    retries_before_first_token: int = setting(1, "times a request whose prefill or decode node failed "
                                                 "(UNAVAILABLE: gone, hung, draining) before its first token "
                                                 "starts over on other nodes; 0 = never")
    resumes_after_first_token: int = setting(2, "times a request whose decode node failed (UNAVAILABLE: gone, "
                                                "hung, draining past its timeout) after its first token goes "
                                                "on, recomputed, on another decode node; 0 = never")
    admin_listen: str = setting("", "host:port of the gateway's Admin port (Admin/Drain): mTLS, admin "
                                    "certificates only; empty = none (SIGTERM drains). The public port never "
                                    "serves Admin")
    http_listen: str = setting("", "host:port of the OpenAI-compatible HTTP front (/v1/completions, "
                                   "/v1/chat/completions, /v1/models); port 0 = ephemeral, empty = off")
    http_max_body_mib: float = setting(4.0, "largest HTTP request body; a larger one gets 413")
    max_request_mib: float = setting(4.0, "largest gRPC request a client may send the gateway (a Generate "
                                          "request); a larger one gets RESOURCE_EXHAUSTED unparsed")
    http_max_connections: int = setting(8192, "most HTTP connections and requests at once (beyond: 503); "
                                              "0 = no limit")
    http_body_timeout_s: float = setting(30.0, "seconds a client has to send its whole HTTP request body "
                                               "(then 408); 0 = no limit")
    http_header_timeout_s: float = setting(10.0, "seconds an HTTP connection has to send a request's complete "
                                                 "headers (from when it is made, or from a keep-alive "
                                                 "request's first byte), then it is closed; 0 = no limit")
    api_key: str = dataclasses.field(default="", repr=False, metadata={"help": (  # never in a repr or a log
        "API keys callers must send (gRPC metadata / HTTP header 'authorization: Bearer KEY'), "
        "comma-separated; prefer the variable or --api-key-file to a flag (a flag shows in ps); "
        "empty and no --api-key-file = open")})
    api_key_file: Path | None = setting(None, "file of API keys, one a line (blank lines and # comments "  # noqa: RUF009
                                              "ignored), re-read when it changes; with --api-key, both count")
    api_key_open_services: str = setting("health,reflection", "gRPC services served without a key when keys are "
                                                              "set: health, reflection and/or full service "
                                                              "names (e.g. pdserve.v1.Admin); empty = none")
    tls_cert: Path | None = setting(None, "PEM certificate (chain) of the gateway's public gRPC and HTTP ports: "  # noqa: RUF009
                                          "they serve TLS with it (no client certificate asked for), re-read "
                                          "when it changes; with --tls-key; unset = plaintext")
    tls_key: Path | None = setting(None, "PEM private key of --tls-cert, re-read when it changes")  # noqa: RUF009
    routing: str = setting("cache_aware", "how a request's nodes are chosen: cache_aware (the prefill node holding "
                                          "the longest prefix of the prompt, by the gateway's index of what it "
                                          "routed, unless its load exceeds the least loaded's by more than "
                                          "--routing-load-margin; decode candidates by held prefix, then free "
                                          "blocks) or load (least loaded prefill node, decode by free blocks)")
    routing_load_margin: int = setting(16, "cache_aware: requests (running + waiting) a node holding the prefix may "
                                          "have beyond the least loaded node and still be chosen")
    tool_call_parser: str = setting("auto", "how the HTTP front reads tool calls in the output and forces them "
                                            "(tool_choice required or named): hermes (<tool_call>{json}"
                                            "</tool_call>: Qwen2.5/Qwen3, Hermes), llama3_json (Llama 3.1+), "
                                            "mistral ([TOOL_CALLS][...]), gpt_oss (alias openai: GPT-OSS's "
                                            "harmony commentary to=functions.NAME; not forced), gemma4 "
                                            "(<|tool_call>call:NAME{...}<tool_call|>), glm45, glm47, "
                                            "qwen3_coder, deepseek_v3, deepseek_v31, kimi_k2, minimax_m2, "
                                            "seed_oss; auto: chosen "
                                            "from the chat template (hermes when it has no tool section)")
    reasoning_parser: str = setting("", "qwen3 or deepseek_r1: the HTTP front moves the output's <think>…</think> "
                                        "into reasoning_content; gpt_oss (alias openai_gptoss): GPT-OSS's "
                                        "analysis channel, its final channel the content; gemma4: its "
                                        "<|channel>thought channel; a response_format "
                                        "applies after the reasoning; empty: none")
    served_model_name: str = setting("", "the model id of the HTTP front (what /v1/models lists and requests "
                                         "name); empty = the model file's name without extension and "
                                         "quantization, e.g. SmolLM2-135M-Instruct")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.prefill_addresses:
            raise ValueError("prefill: at least one prefill node address is required")
        if not self.decode_addresses:
            raise ValueError("decode: at least one decode node address is required")
        for entry, role in self.nodes():
            try:
                parse_entry(entry, role)
            except ValueError as error:
                raise ValueError(f"{role}: {error}") from None
        every = [entry for entry, _ in self.nodes()]
        if len(set(every)) != len(every):
            raise ValueError(f"a node entry is listed twice: {every}")
        if self.resolve_interval_s <= 0:
            raise ValueError(f"resolve_interval_s must be > 0, got {self.resolve_interval_s}")
        if self.retries_before_first_token < 0:
            raise ValueError(f"retries_before_first_token must be >= 0, got {self.retries_before_first_token}")
        if self.resumes_after_first_token < 0:
            raise ValueError(f"resumes_after_first_token must be >= 0, got {self.resumes_after_first_token}")
        if self.generation_config not in ("auto", "none"):
            raise ValueError(f"generation_config must be auto or none, got {self.generation_config!r}")
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if min(self.poll_interval_s, self.status_timeout_s, self.abort_timeout_s) <= 0:
            raise ValueError("poll_interval_s, status_timeout_s and abort_timeout_s must be > 0")
        if self.max_model_len < 0 or self.request_timeout_s < 0 or self.status_max_age_s < 0:
            raise ValueError("max_model_len, request_timeout_s and status_max_age_s must be >= 0")
        if self.http_listen:
            check_host_port("http_listen", self.http_listen, "host:port or empty")
        if self.admin_listen:
            check_host_port("admin_listen", self.admin_listen, "host:port or empty")
        if min(self.http_max_connections, self.http_body_timeout_s, self.http_header_timeout_s) < 0:
            raise ValueError("http_max_connections, http_body_timeout_s and http_header_timeout_s must be >= 0 "
                             "(0 = no limit)")
        if self.http_max_body_mib <= 0 or self.max_request_mib <= 0:
            raise ValueError(f"http_max_body_mib and max_request_mib must be > 0, got {self.http_max_body_mib} "
                             f"and {self.max_request_mib}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key: give both (the public ports' certificate and its key) or "
                             f"neither, got tls_cert={self.tls_cert} and tls_key={self.tls_key}")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing!r}")
        if self.routing_load_margin < 0:
            raise ValueError(f"routing_load_margin must be >= 0, got {self.routing_load_margin}")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got "
                             f"{self.tool_call_parser!r}")
        if self.reasoning_parser and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)} or empty, got "
                             f"{self.reasoning_parser!r}")
        if any(any(c.isspace() for c in key) for key in self.api_keys):
            raise ValueError("api_key: a key must not contain whitespace")  # the key itself is not named

    @property
    def api_keys(self) -> tuple[str, ...]:
        """The ``--api-key`` keys (``--api-key-file``'s are read by ``services.gateway.api_keys``)."""
        return split_addresses(self.api_key)

    @property
    def open_services(self) -> tuple[str, ...]:
        return split_addresses(self.api_key_open_services)

    @property
    def prefill_addresses(self) -> tuple[str, ...]:
        return split_addresses(self.prefill)

    @property
    def decode_addresses(self) -> tuple[str, ...]:
        return split_addresses(self.decode)

    @property
    def cache_store_addresses(self) -> tuple[str, ...]:
        return split_addresses(self.cache_store)

    def nodes(self) -> list[tuple[str, str]]:
        """(entry, role) of every configured entry: ``host:port`` or ``dns:///NAME:PORT``."""
        return [*((a, PREFILL) for a in self.prefill_addresses), *((a, DECODE) for a in self.decode_addresses),
                *((a, CACHE_STORE) for a in self.cache_store_addresses)]
