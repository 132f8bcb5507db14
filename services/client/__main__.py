"""``python -m services.client "prompt"``: stream a generation from a pdserve gateway to the terminal.

Uses only the generated client package (``pdserve.v1``, installable with ``pip install protos/python``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

UINT32_MAX, UINT64_MAX = 2**32 - 1, 2**64 - 1  # what the fields carry (the gateway refuses seeds >= 2^63)
INT32_MAX = 2**31 - 1
OPTIONAL_FLOATS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
"""Sampling fields sent only when their flag is given (unset on the wire means off); the gateway checks
their ranges and names the field when one is out."""


def _in_range(minimum: int, maximum: int):
    def parse(text: str) -> int:
        value = int(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be in [{minimum}, {maximum}], got {value}")
        return value
    return parse


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def _pem_file(text: str) -> bytes:
    try:
        data = Path(text).read_bytes()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {error.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise argparse.ArgumentTypeError(f"{text} holds no PEM certificate")
    return data


def _env_key() -> str | None:
    """The first key of ``PDSERVE_API_KEY`` (the gateway's own setting may list several)."""
    keys = [k.strip() for k in os.environ.get("PDSERVE_API_KEY", "").split(",") if k.strip()]
    return keys[0] if keys else None


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Names a flag's default in its help, unless it has none (unset: the gateway's default applies) or the
    help says it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=_DefaultsHelp)
    parser.add_argument("prompt", help="the prompt (a user message with --chat)")
    parser.add_argument("--address", default="127.0.0.1:50051", help="gateway host:port (make run's gateway)")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    parser.add_argument("--max-tokens", type=_in_range(1, UINT32_MAX), default=128, help="new tokens at most")
    parser.add_argument("--temperature", type=float,
                        help="0: greedy (default: the gateway's, as for gRPC and HTTP clients: the model's "
                             "generation_config.json, else 1)")
    parser.add_argument("--seed", type=_in_range(0, UINT64_MAX), help="sampling seed (default: random)")
    parser.add_argument("--top-p", type=float, help="nucleus sampling, (0, 1]")
    parser.add_argument("--top-k", type=_in_range(-1, INT32_MAX), help="sample among the k likeliest (0/-1: all)")
    parser.add_argument("--min-p", type=float, help="drop tokens less likely than min_p x the likeliest, [0, 1]")
    parser.add_argument("--presence-penalty", type=float, help="[-2, 2]: once per token already generated")
    parser.add_argument("--frequency-penalty", type=float, help="[-2, 2]: per occurrence in the output")
    parser.add_argument("--repetition-penalty", type=float, help="[0.01, 100], 1 = off: prompt and output tokens")
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--min-tokens", type=_in_range(0, UINT32_MAX), default=0, help="no stop before this many")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    parser.add_argument("--api-key", default=_env_key(),
                        help="the gateway's API key, sent as 'authorization: Bearer KEY' (default: the first key "
                             "of $PDSERVE_API_KEY; none: send no key)")
    parser.add_argument("--tls-ca", type=_pem_file, metavar="FILE",
                        help="connect with TLS, verifying the gateway's certificate against this CA (PEM) — a "
                             "gateway started with --tls-cert/--tls-key")
    parser.add_argument("--tls", action="store_true",
                        help="connect with TLS, verifying the gateway's certificate against the system's roots")
    parser.add_argument("--timeout", type=_positive_seconds, default=120.0, help="deadline of the call in seconds")
    return parser.parse_args(argv)


def build_request(args: argparse.Namespace) -> gateway_pb2.GenerateRequest:
    sampling = gateway_pb2.SamplingParams(max_tokens=args.max_tokens, stop=args.stop, min_tokens=args.min_tokens,
                                          ignore_eos=args.ignore_eos)
    for name in ("seed", "top_k", *OPTIONAL_FLOATS):
        if getattr(args, name) is not None:
            setattr(sampling, name, getattr(args, name))
    if args.chat:
        return gateway_pb2.GenerateRequest(messages=[gateway_pb2.ChatMessage(role="user", content=args.prompt)],
                                           sampling=sampling)
    return gateway_pb2.GenerateRequest(prompt=args.prompt, sampling=sampling)


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    """Plaintext (the default: ``make run``'s gateway), or TLS with ``--tls-ca`` / ``--tls``."""
    if args.tls_ca is not None or args.tls:
        return grpc.secure_channel(args.address, grpc.ssl_channel_credentials(root_certificates=args.tls_ca))
    return grpc.insecure_channel(args.address)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with open_channel(args) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        try:
            metadata = (("authorization", f"Bearer {args.api_key}"),) if args.api_key else None
            for response in stub.Generate(build_request(args), timeout=args.timeout, metadata=metadata):
                sys.stdout.write(response.text)
                sys.stdout.flush()
                if response.finish_reason:
                    usage = response.usage
                    sys.stderr.write(f"\n[{response.finish_reason}: {usage.prompt_tokens} prompt, "
                                     f"{usage.completion_tokens} completion, {usage.cached_tokens} cached tokens]\n")
        except grpc.RpcError as exc:
            sys.stderr.write(f"\nerror: {exc.code().name}: {exc.details()}\n")
            return 1
        except KeyboardInterrupt:  # leaving the channel cancels the call: the gateway frees the request
            sys.stderr.write("\n[interrupted]\n")
            return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
