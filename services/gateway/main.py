"""``python -m services.gateway``: config → tokenizer and model config → core → server, until SIGTERM."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.bootstrap import run_service
from services.common.loop_watchdog import LoopWatchdog
from services.common.server import NodeServer, ServiceBinding
from services.engine.chat_template import template_source
from services.engine.generation_defaults import generation_defaults
from services.engine.model_files import bundled_model_path
from services.engine.tokenizer import Tokenizer
from services.gateway.api_keys import ApiKeys
from services.gateway.auth_interceptor import ApiKeyInterceptor, open_services
from services.gateway.config import GatewayConfig
from services.gateway.core import CoreSettings, GatewayCore
from services.gateway.directory import NodeDirectory
from services.gateway.discovery import Resolver
from services.gateway.metrics import gateway_registry
from services.gateway.model_check import ModelIdentity, model_identity
from services.gateway.openai.app import FrontSettings, FrontState, create_app, served_model_id
from services.gateway.openai.server import HttpFront
from services.gateway.public_tls import PublicTls
from services.gateway.router import Router
from services.gateway.servicer import GatewayServicer

log = structlog.get_logger(__name__)


@dataclass
class Gateway:
    """The assembled service (also what tests run in-process)."""

    config: GatewayConfig
    core: GatewayCore
    directory: NodeDirectory
    server: NodeServer
    servicer: GatewayServicer | None = None
    http: HttpFront | None = None  # the OpenAI-compatible HTTP front, when ``http_listen`` is set

    async def start(self) -> None:
        """First poll of every node, then serve gRPC and HTTP (nodes that are not up yet join on a later
        poll). Health says SERVING only once both are bound, so a launcher never takes a gateway whose
        HTTP front failed to bind for a ready one."""
        await self.directory.start()
        await self.server.start(serving=self.http is None)
        if self.http is not None:
            try:
                await self.http.start()
            except BaseException:
                await self.stop()
                raise
        if self.servicer is not None:  # before SERVING: a ClusterStatus then names both URLs
            self.servicer.metrics_url = self.server.metrics_url(self.config.advertise)
            self.servicer.http_url = self.http.url if self.http is not None else ""
        if self.http is not None:
            await self.server.set_serving(True)

    async def stop(self) -> None:
        """Drain (in-flight requests get ``grace_s``), stop the servers, stop polling."""
        try:
            await self.server.shutdown()
        finally:
            await self.close()

    async def close(self) -> None:
        """What the drain left running: the HTTP front (when the drain was cut short), the polling."""
        try:
            if self.http is not None:
                await self.http.stop()
        finally:
            self.core.close()
            await self.directory.close()


def assemble(config: GatewayConfig, tokenizer: Tokenizer, *, vocab_size: int, max_position: int,
             resolver: Resolver | None = None, model: ModelIdentity | None = None, hidden_size: int = 0) -> Gateway:
    """Build the gateway inside the running event loop; nothing is started. ``hidden_size``: the model's (an
    embedding's values; 0: ``dimensions`` unchecked). ``resolver`` answers the
    ``dns:///`` entries (default: the system's); ``model`` is the one ``tokenizer`` belongs to: model
    nodes that serve another are left out (``None``: not checked), as are those whose mode differs from
    ``config.deterministic``."""
    directory = NodeDirectory(config.nodes(), poll_interval_s=config.poll_interval_s,
                              status_timeout_s=config.status_timeout_s,
                              max_message_bytes=config.max_message_mib << 20,
                              resolve_interval_s=config.resolve_interval_s, resolver=resolver, model=model,
                              deterministic=config.deterministic)
    settings = CoreSettings(
        max_model_len=min(config.max_model_len or max_position, max_position), vocab_size=vocab_size,
        max_tokens_cap=config.default_max_tokens, request_timeout_s=config.request_timeout_s,
        abort_timeout_s=config.abort_timeout_s, status_max_age_s=config.status_max_age_s,
        retries_before_first_token=config.retries_before_first_token,
        resumes_after_first_token=config.resumes_after_first_token, hidden_size=hidden_size,
        sampling_defaults=generation_defaults(config.model) if config.model and config.generation_config == "auto"
        else {})
    watchdog = LoopWatchdog()  # a call to a node that fails out of this gateway's own stall is said to be so
    core = GatewayCore(tokenizer, directory, settings, recent_stall=watchdog.recent_stall_s,
                       router=Router(config.routing, config.routing_load_margin))
    registry, metrics = gateway_registry(directory.nodes, asyncio.get_running_loop(), core.tokenizing_pending)
    core.on_retry = lambda role: metrics.retries.labels(role).inc()
    core.on_embedded = metrics.embedded
    servicer = GatewayServicer(core, metrics)
    servicer.served_model_name = config.served_model_name or served_model_id(config.model or bundled_model_path())
    binding = ServiceBinding(gateway_pb2.DESCRIPTOR.services_by_name["Gateway"], servicer,
                             gateway_pb2_grpc.add_GatewayServicer_to_server)
    keys = ApiKeys(config.api_keys, config.api_key_file)
    tls = PublicTls(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
    http = None
    if config.http_listen:
        state = FrontState()
        front = FrontSettings(servicer.served_model_name,
                              max_body_bytes=int(config.http_max_body_mib * (1 << 20)),
                              body_timeout_s=config.http_body_timeout_s, api_keys=keys,
                              tool_call_parser=config.tool_call_parser, reasoning_parser=config.reasoning_parser)
        http = HttpFront(create_app(core, metrics, front, state), config.http_listen, state, config.grace_s,
                         max_connections=config.http_max_connections or None,
                         header_timeout_s=config.http_header_timeout_s,
                         ssl_context=tls.ssl_context() if tls is not None else None)

    async def drain() -> None:
        if http is not None:
            http.state.draining = True  # new HTTP requests: 503; those in flight finish within grace_s
        await core.drain(config.grace_s)
        if http is not None:
            await http.stop()

    interceptors = [ApiKeyInterceptor(keys, open_services(config.open_services))] if keys.enabled else []
    server = NodeServer.from_config(config, [binding], drain=drain, registry=registry,
                                    max_receive_bytes=int(config.max_request_mib * (1 << 20)),
                                    watchdog=watchdog, interceptors=interceptors,
                                    public_credentials=tls.grpc_credentials() if tls is not None else None,
                                    admin_listen=config.admin_listen)
    return Gateway(config, core, directory, server, servicer, http)


async def serve(config: GatewayConfig) -> None:
    started = time.perf_counter()
    path = config.model or bundled_model_path()
    template = template_source(config.chat_template) if config.chat_template else None  # before slow loads
    identity, model = await asyncio.to_thread(model_identity, path)  # reads the weight files once
    tokenizer = Tokenizer.load(path, model.eos_token_ids, config.trust_remote_code)
    if template is not None:
        tokenizer.use_chat_template(template)
    gateway = assemble(config, tokenizer, vocab_size=model.vocab_size, max_position=model.max_position,
                       hidden_size=model.hidden_size,
                       model=identity)
    await gateway.start()
    log.info("gateway ready", address=gateway.server.address, http=gateway.http.url if gateway.http else "",
             model=str(path), served_model_name=gateway.servicer.served_model_name if gateway.servicer else "",
             weights_digest=identity.weights_digest, deterministic=config.deterministic,
             max_model_len=gateway.core.settings.max_model_len, prefill=config.prefill_addresses,
             decode=config.decode_addresses, cache_store=config.cache_store_addresses,
             api_keys="required" if config.api_key or config.api_key_file else "off",
             public_tls=str(config.tls_cert) if config.tls_cert else "off",
             startup_s=round(time.perf_counter() - started, 2))
    try:
        await gateway.server.serve_until_signalled()
    finally:
        await gateway.close()


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(GatewayConfig, argv, module="services.gateway", tracing_name="pdserve-gateway", serve=serve,
                       role="gateway")
