"""``pdserve.v1.SamplingParams`` ↔ ``services.engine.sampling_params.SamplingParams``.

The proto's scalar fields are ``optional``: an unset field takes the server's default, an explicit 0 is
kept (and ``max_tokens = 0`` is then refused by validation). ``SamplingFields`` is what the client gave,
``None`` where it gave nothing; ``resolve`` fills the defaults. The gateway resolves once (a default
``max_tokens`` from the prompt length, a random seed) and sends the resolved params on, so every node
samples the same stream; a node reading resolved params uses ``sampling_from_proto``.

``top_k``: the proto's -1 ("no limit") becomes the engine's 0. Other negatives pass through so that
validation names the field.

One definition: ``SamplingFields`` and both conversions are derived from the fields of the engine's
``SamplingParams`` (which of them a client may leave unset, and their defaults, are declared there); the
proto's field of each has the same name (a map is a tuple of (key, value) pairs here, a repeated field a
tuple). A new sampling field is declared in ``SamplingParams`` and the proto, and the OpenAI body if the
HTTP API takes it.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from pdserve.v1 import gateway_pb2

from services.engine.sampling_params import (
    DEFAULT_MAX_TOKENS,
    SamplingParams,
    client_fields,
    takes_default_when_unset,
)
from services.engine.structured_spec import StructuredSpec

DEFAULT_MAX_TOKENS_CAP = 256
SEED_BITS = 63
_WIRE = gateway_pb2.SamplingParams.DESCRIPTOR.fields_by_name  # the proto field of each SamplingParams field
STRUCTURED = "structured"  # a message on the wire, a StructuredSpec here


def _unset_type(annotation: Any) -> Any:
    """``annotation | None`` (annotations are strings under ``from __future__ import annotations``)."""
    if not isinstance(annotation, str):
        return annotation | None
    return annotation if annotation.replace(" ", "").endswith("|None") else f"{annotation} | None"


def _fields_spec() -> list[tuple[str, Any, dataclasses.Field[Any]]]:
    """``SamplingParams``' client fields: ``T | None = None`` where a client may leave one unset, the same
    type and default otherwise."""
    spec = []
    for f in client_fields():
        if takes_default_when_unset(f):
            spec.append((f.name, _unset_type(f.type), dataclasses.field(default=None)))
        elif f.default_factory is not dataclasses.MISSING:
            spec.append((f.name, f.type, dataclasses.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, f.type, dataclasses.field(default=f.default)))
    return spec


def with_defaults(self: SamplingFields, defaults: dict[str, float | int]) -> SamplingFields:
    """These fields, where unset taking ``defaults`` (a checkpoint's generation config)."""
    given = {name: value for name, value in defaults.items() if getattr(self, name) is None}
    return dataclasses.replace(self, **given) if given else self


def resolve(self: SamplingFields, *, default_max_tokens: int = DEFAULT_MAX_TOKENS, default_seed: int | None = None
            ) -> SamplingParams:
    """Engine params with the defaults filled in: ``default_max_tokens``, ``default_seed``, and for every
    other unset field ``SamplingParams``' default (temperature 1, top_p 1, top_k 0 = off, penalties and
    min_p off)."""
    server = {"max_tokens": default_max_tokens, "seed": default_seed}
    values = {}
    for f in client_fields():
        value = getattr(self, f.name)
        if value is None and takes_default_when_unset(f):
            value = server.get(f.name, f.default)
        values[f.name] = value
    if values["top_k"] == -1:
        values["top_k"] = 0
    return SamplingParams(**values)


SamplingFields = dataclasses.make_dataclass(
    "SamplingFields", _fields_spec(), frozen=True,
    namespace={"with_defaults": with_defaults, "resolve": resolve, "__doc__": (
        "A request's sampling settings as given; ``None`` = not set. Generated from ``SamplingParams``' "
        "fields (``services.engine.sampling_params``): each one a client may leave unset is ``T | None = None`` "
        "here, every other has its type and default.")})
SamplingFields.__module__ = __name__  # make_dataclass's ``module=`` is Python 3.12's


def _is_map(wire: Any) -> bool:
    return wire.message_type is not None and wire.message_type.GetOptions().map_entry


def _is_repeated(wire: Any) -> bool:
    repeated = getattr(wire, "is_repeated", None)  # protobuf >= 5.29; ``label`` is gone in 7
    return repeated if repeated is not None else wire.label == wire.LABEL_REPEATED


def fields_from_proto(message: gateway_pb2.SamplingParams) -> SamplingFields:
    """What the client gave: an unset ``optional`` field is None; a map becomes its (key, value) pairs in
    key order, a repeated field a tuple."""
    values: dict[str, Any] = {}
    for f in client_fields():
        wire = _WIRE[f.name]
        if f.name == STRUCTURED:
            values[f.name] = structured_from_proto(message.structured) if message.HasField(f.name) else None
        elif takes_default_when_unset(f):
            values[f.name] = getattr(message, f.name) if message.HasField(f.name) else None
        elif _is_map(wire):
            values[f.name] = tuple(sorted(getattr(message, f.name).items()))
        elif _is_repeated(wire):
            values[f.name] = tuple(getattr(message, f.name))
        else:
            values[f.name] = getattr(message, f.name)
    return SamplingFields(**values)


def sampling_from_proto(message: gateway_pb2.SamplingParams, *, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                        default_seed: int | None = None) -> SamplingParams:
    """Engine params from a proto; unset fields take the defaults (see ``SamplingFields.resolve``)."""
    return fields_from_proto(message).resolve(default_max_tokens=default_max_tokens, default_seed=default_seed)


def sampling_to_proto(params: SamplingParams) -> gateway_pb2.SamplingParams:
    """Every scalar set explicitly (``seed`` and ``logprobs`` only when there is one), so the receiver needs
    no defaults."""
    values: dict[str, Any] = {}
    for f in client_fields():
        value = getattr(params, f.name)
        if value is None:
            continue
        wire = _WIRE[f.name]
        if f.name == STRUCTURED:
            values[f.name] = structured_to_proto(value)
            continue
        values[f.name] = dict(value) if _is_map(wire) else list(value) if _is_repeated(wire) else value
    return gateway_pb2.SamplingParams(**values)


def structured_from_proto(message: gateway_pb2.StructuredOutput) -> StructuredSpec:
    """The spec of a set ``StructuredOutput`` (no kind set: kind "" — refused by ``check_shape``)."""
    kind = message.WhichOneof("kind") or ""
    after = tuple(message.starts_after_token_ids)
    if not after and message.HasField("starts_after_token_id"):  # a sender of an earlier version
        after = (message.starts_after_token_id,)
    if kind == "choice":
        return StructuredSpec("choice", choices=tuple(message.choice.choices), starts_after_token_ids=after)
    if kind == "json_object":
        return StructuredSpec("json_object", starts_after_token_ids=after)
    return StructuredSpec(kind, text=getattr(message, kind) if kind else "", starts_after_token_ids=after)


def structured_to_proto(spec: StructuredSpec) -> gateway_pb2.StructuredOutput:
    after = spec.starts_after_token_ids
    message = gateway_pb2.StructuredOutput(starts_after_token_ids=after,  # and alone for earlier versions' nodes:
                                           starts_after_token_id=after[0] if len(after) == 1 else None)
    if spec.kind == "choice":
        message.choice.choices.extend(spec.choices)
    elif spec.kind == "json_object":
        message.json_object = True
    else:
        setattr(message, spec.kind, spec.text)
    return message


def default_max_tokens(prompt_len: int, max_model_len: int, cap: int = DEFAULT_MAX_TOKENS_CAP) -> int:
    """``min(cap, room left in the context)``, at least 1 (a prompt that fills the context is refused by
    validation as a ``prompt`` error, not a ``max_tokens`` one)."""
    return max(1, min(cap, max_model_len - prompt_len))


def random_seed() -> int:
    """A fresh non-negative 63-bit seed (fits int64 and uint64 alike)."""
    return secrets.randbits(SEED_BITS)
