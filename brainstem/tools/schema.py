"""A tool's input as a JSON Schema: what an ``agent`` step offers the model, and checks its calls against.

A meta's ``input`` is a JSON Schema (``{"type": "object", "properties": ...}``).
Older metas describe each argument in prose (``{"url": "string, required:
the URL"}``); those still work: each prose line becomes a property's
``description``, and nothing is checked but that the arguments are an object.

The agent writes both a tool's schema and, through the model, the arguments
checked against it, and the check runs in the runtime, not the sandbox. So
the keywords that run the agent's regular expressions (``pattern``,
``patternProperties``) are offered to the model but not evaluated here (one
catastrophic pattern would hang the session); the tool, sandboxed and timed,
checks those itself. References are resolved inside the schema only: no
schema is ever fetched.
"""

from __future__ import annotations

import json
from typing import Any

from brainstem.tools.tool import ToolMeta

SCHEMA_MARKS = ("type", "properties", "$schema", "oneOf", "anyOf", "allOf", "$ref")
_NOT_EVALUATED = ("pattern", "patternProperties")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_VALUES = ("enum", "const", "default", "examples")  # data, not schemas
MAX_ERROR_CHARS = 300


class SchemaError(ValueError):
    """A meta's ``input`` is not a usable JSON Schema (the message names what is wrong)."""


def is_schema(value: Any) -> bool:
    return isinstance(value, dict) and any(mark in value for mark in SCHEMA_MARKS)


def input_schema(meta: ToolMeta) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments; :class:`SchemaError` if ``input`` is a broken schema."""
    raw = meta.input
    if not raw:
        return {"type": "object"}
    if is_schema(raw):
        _check_schema(raw)
        if raw.get("type", "object") != "object":
            raise SchemaError(f"input must describe an object (its arguments), not type {raw.get('type')!r}")
        return raw
    properties: dict[str, Any] = {}
    for name, desc in raw.items():
        if is_schema(desc) or (isinstance(desc, dict) and "description" in desc):
            _check_schema(desc)
            properties[str(name)] = desc
        else:
            properties[str(name)] = {"description": desc if isinstance(desc, str) else json.dumps(desc)}
    return {"type": "object", "properties": properties}


def function_spec(name: str, meta: ToolMeta) -> dict[str, Any]:
    """The tool in the OpenAI function-calling format."""
    return {"type": "function", "function": {"name": name, "description": meta.description[:1024],
                                             "parameters": input_schema(meta)}}


def check_arguments(schema: dict[str, Any], arguments: str) -> tuple[Any, str | None]:
    """(the parsed arguments, None) when ``arguments`` (the model's JSON text) fit ``schema``;
    (None, what is wrong) otherwise, in one line the model can act on."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError) as exc:
        return None, f"the arguments are not valid JSON ({_short(exc)}); send one JSON object"
    if not isinstance(args, dict):
        return None, f"the arguments must be a JSON object, not {type(args).__name__}"
    from jsonschema import Draft202012Validator  # noqa: PLC0415 -- heavy: only an agent step needs it

    try:
        error = next(iter(Draft202012Validator(_evaluated(schema)).iter_errors(args)), None)
    except RecursionError:
        return None, "the arguments are nested too deeply to check"
    except Exception as exc:  # noqa: BLE001 - a schema the validator chokes on is the tool's fault
        return None, f"the tool's input schema cannot be checked ({_short(exc)})"
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        return None, f"the arguments do not fit the tool's input schema at {where}: {_short(error.message)}"
    return args, None


def _check_schema(schema: Any) -> None:
    from jsonschema import Draft202012Validator  # noqa: PLC0415 -- heavy: only an agent step needs it
    from jsonschema.exceptions import SchemaError as JSONSchemaError  # noqa: PLC0415 -- as above

    try:
        Draft202012Validator.check_schema(schema)
    except JSONSchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise SchemaError(f"input is not a valid JSON Schema at {where}: {_short(exc.message)}") from None
    except RecursionError:
        raise SchemaError("input is nested too deeply to be a JSON Schema") from None


def _evaluated(schema: Any) -> Any:
    """``schema`` without the keywords the runtime will not evaluate (the agent's regular expressions).
    Names in ``properties`` are the tool's arguments, not keywords: an argument called ``pattern`` stays."""
    if isinstance(schema, list):
        return [_evaluated(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _NOT_EVALUATED:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _evaluated(sub) for name, sub in value.items()}
        elif key in _VALUES:
            out[key] = value
        else:
            out[key] = _evaluated(value)
    return out


def _short(exc: Any) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"
