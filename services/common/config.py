"""Frozen dataclass configs built from CLI flags and ``PDSERVE_*`` environment variables.

Each field ``some_name`` of a service's config dataclass is the flag ``--some-name`` and the variable
``PDSERVE_SOME_NAME``. A flag overrides the variable, which overrides the field's default; a field
without a default must come from one of them. Supported field types: ``str``, ``int``, ``float``,
``bool`` (``--x``/``--no-x``; variables accept 1/0, true/false, yes/no, on/off), ``pathlib.Path`` and
``X | None`` of those (the empty string means None). A field's ``metadata={"help": ...}`` is its help.
Validation beyond types belongs in the dataclass's ``__post_init__``; its ``ValueError`` becomes a
usage error naming the problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

ENV_PREFIX = "PDSERVE_"

C = TypeVar("C")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def setting(default: Any, help: str) -> Any:
    """A config field with a default and its help text: ``port: int = setting(0, "port to serve on")``."""
    return dataclasses.field(default=default, metadata={"help": help})


def env_name(field_name: str, prefix: str = ENV_PREFIX) -> str:
    return prefix + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}, got {text!r}")


def _parser_of(annotation: Any) -> tuple[Callable[[str], Any], bool]:
    """(text → value, optional) for a field's resolved type annotation."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported config field type {annotation!r}")
        annotation, optional = args[0], True
    if annotation is bool:
        return parse_bool, optional
    if annotation in (str, int, float, Path):
        return annotation, optional
    raise TypeError(f"unsupported config field type {annotation!r}")


def _convert(text: str, parse: Callable[[str], Any], optional: bool) -> Any:
    if optional and text == "":
        return None
    return parse(text)


def build_config(
    cls: type[C],
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    prog: str | None = None,
    description: str | None = None,
    env_prefix: str = ENV_PREFIX,
) -> C:
    """Parse ``argv`` (default ``sys.argv[1:]``) and ``env`` (default ``os.environ``) into ``cls``.

    Bad input (an unparsable value, a missing required field, a ``__post_init__`` ValueError) exits
    with argparse's usage error (status 2) naming the flag and variable.
    """
    assert dataclasses.is_dataclass(cls), f"{cls!r} is not a dataclass"
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    # no abbreviations: `--port 50052` is not `--port-file 50052` (a file named 50052, the service on another port)
    parser = argparse.ArgumentParser(prog=prog, description=description or cls.__doc__, allow_abbrev=False)
    converters: dict[str, tuple[Callable[[str], Any], bool]] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        parse, optional = converters[field.name] = _parser_of(hints[field.name])
        variable = env_name(field.name, env_prefix)
        no_default = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if field.default is not dataclasses.MISSING:
            origin = f"env {variable}; default {field.default!r}"
        else:
            origin = f"env {variable}" + ("; required" if no_default else "")
        help_text = f"{field.metadata.get('help', '')} ({origin})".lstrip()
        if parse is parse_bool:
            parser.add_argument(flag_name(field.name), dest=field.name, default=None, help=help_text,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag_name(field.name), dest=field.name, default=None, help=help_text,
                                metavar=field.name.upper())
    args = parser.parse_args(argv)

    values: dict[str, Any] = {}
    for name, (parse, optional) in converters.items():
        raw = getattr(args, name)
        variable = env_name(name, env_prefix)
        source, text = (flag_name(name), raw) if raw is not None else (variable, env.get(variable))
        if isinstance(text, bool):  # a --x/--no-x flag
            values[name] = text
        elif text is not None:
            try:
                values[name] = _convert(text, parse, optional)
            except ValueError as error:
                parser.error(f"{source}: {error}")
    missing = [
        f"{flag_name(f.name)} (or {env_name(f.name, env_prefix)})"
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        parser.error("missing required settings: " + ", ".join(missing))
    try:
        return cls(**values)
    except ValueError as error:
        parser.error(str(error))
    raise AssertionError("unreachable: parser.error exits")
