"""The tool-calling parts of a chat completions body (pydantic; a bad shape is a 400 naming it, e.g.
``tools[1].function.name`` or ``messages[2].tool_calls[0].function.arguments``).

- ``tools``: ``[{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]``;
  a name is 1 to 64 of ``a-z A-Z 0-9 _ -`` (OpenAI's rule), ``parameters`` a JSON schema object.
- ``tool_choice``: ``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name"}}``.
- an assistant message's ``tool_calls``: ``[{"id", "type": "function", "function": {"name", "arguments"}}]``,
  ``arguments`` the JSON text of an object (a JSON object itself is taken too, and written as text).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _function_name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(f"a function name is 1 to 64 of a-z, A-Z, 0-9, _ and -, got {value!r}"[:200])
    return value


class FunctionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # None: no arguments
    strict: bool | None = None  # forced calls follow the schema anyway; auto calls are parsed as they come

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _function_name(value)


class ToolBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionBody


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str = Field(...)

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_object_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return json.dumps(value, ensure_ascii=False)
        if not isinstance(value, str):
            raise ValueError(f"expected the JSON text of an object, got {type(value).__name__}")
        try:
            parsed = json.loads(value)
        except ValueError as error:
            raise ValueError(f"not valid JSON: {error}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"expected a JSON object, got {type(parsed).__name__}")
        return value


class ToolCallBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction
