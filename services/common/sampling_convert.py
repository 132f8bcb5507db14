"""``pdserve.v1.SamplingParams`` ↔ ``services.engine.sampling_params.SamplingParams``.

The proto's scalar fields are ``optional``: an unset field takes the server's default, an explicit 0 is
kept (and ``max_tokens = 0`` is then refused by validation). ``SamplingFields`` is what the client gave,
``None`` where it gave nothing; ``resolve`` fills the defaults. The gateway resolves once (a default
``max_tokens`` from the prompt length, a random seed) and sends the resolved params on, so every node
samples the same stream; a node reading resolved params uses ``sampling_from_proto``.

``top_k``: the proto's -1 ("no limit") becomes the engine's 0. Other negatives pass through so that
validation names the field.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass

from pdserve.v1 import gateway_pb2

from services.engine.sampling_params import DEFAULT_MAX_TOKENS, SamplingParams

DEFAULT_MAX_TOKENS_CAP = 256
SEED_BITS = 63


@dataclass(frozen=True)
class SamplingFields:
    """A request's sampling settings as given; ``None`` = not set."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    def with_defaults(self, defaults: dict[str, float | int]) -> SamplingFields:
        """These fields, where unset taking ``defaults`` (a checkpoint's generation config)."""
        given = {name: value for name, value in defaults.items() if getattr(self, name) is None}
        return dataclasses.replace(self, **given) if given else self

    def resolve(self, *, default_max_tokens: int = DEFAULT_MAX_TOKENS, default_seed: int | None = None
                ) -> SamplingParams:
        """Engine params with the defaults filled in (temperature 1, top_p 1, top_k 0 = off, penalties and
        min_p off)."""
        top_k = self.top_k if self.top_k is not None else 0
        return SamplingParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            temperature=self.temperature if self.temperature is not None else 1.0,
            top_p=self.top_p if self.top_p is not None else 1.0,
            top_k=0 if top_k == -1 else top_k,
            seed=self.seed if self.seed is not None else default_seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=self.logprobs,
            presence_penalty=self.presence_penalty if self.presence_penalty is not None else 0.0,
            frequency_penalty=self.frequency_penalty if self.frequency_penalty is not None else 0.0,
            repetition_penalty=self.repetition_penalty if self.repetition_penalty is not None else 1.0,
            min_p=self.min_p if self.min_p is not None else 0.0,
            logit_bias=self.logit_bias,
        )


def fields_from_proto(message: gateway_pb2.SamplingParams) -> SamplingFields:
    def given(name: str) -> object | None:
        return getattr(message, name) if message.HasField(name) else None

    return SamplingFields(
        max_tokens=given("max_tokens"),  # type: ignore[arg-type]
        temperature=given("temperature"),  # type: ignore[arg-type]
        top_p=given("top_p"),  # type: ignore[arg-type]
        top_k=given("top_k"),  # type: ignore[arg-type]
        seed=given("seed"),  # type: ignore[arg-type]
        stop=tuple(message.stop),
        stop_token_ids=tuple(message.stop_token_ids),
        ignore_eos=message.ignore_eos,
        min_tokens=message.min_tokens,
        logprobs=given("logprobs"),  # type: ignore[arg-type]
        presence_penalty=given("presence_penalty"),  # type: ignore[arg-type]
        frequency_penalty=given("frequency_penalty"),  # type: ignore[arg-type]
        repetition_penalty=given("repetition_penalty"),  # type: ignore[arg-type]
        min_p=given("min_p"),  # type: ignore[arg-type]
        logit_bias=tuple(sorted(message.logit_bias.items())),
    )


def sampling_from_proto(message: gateway_pb2.SamplingParams, *, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                        default_seed: int | None = None) -> SamplingParams:
    """Engine params from a proto; unset fields take the defaults (see ``SamplingFields.resolve``)."""
    return fields_from_proto(message).resolve(default_max_tokens=default_max_tokens, default_seed=default_seed)


def sampling_to_proto(params: SamplingParams) -> gateway_pb2.SamplingParams:
    """Every scalar set explicitly (``seed`` only when there is one), so the receiver needs no defaults."""
    message = gateway_pb2.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        min_p=params.min_p,
        logit_bias=dict(params.logit_bias),
    )
    if params.seed is not None:
        message.seed = params.seed
    if params.logprobs is not None:
        message.logprobs = params.logprobs
    return message


def default_max_tokens(prompt_len: int, max_model_len: int, cap: int = DEFAULT_MAX_TOKENS_CAP) -> int:
    """``min(cap, room left in the context)``, at least 1 (a prompt that fills the context is refused by
    validation as a ``prompt`` error, not a ``max_tokens`` one)."""
    return max(1, min(cap, max_model_len - prompt_len))


def random_seed() -> int:
    """A fresh non-negative 63-bit seed (fits int64 and uint64 alike)."""
    return secrets.randbits(SEED_BITS)
