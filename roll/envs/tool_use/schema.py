"""Tool arguments checked against their JSON schema: :func:`schema_error`.

The subset of JSON Schema that function-calling schemas use: ``type`` (``string``, ``integer``, ``number``,
``boolean``, ``array``, ``object``, ``null``, or a list of them), ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties`` (false by default at the top level: an argument the schema does not name is an error),
``items``, ``minItems``/``maxItems``, ``minLength``/``maxLength``, ``minimum``/``maximum``. JSON has no separate
booleans-as-numbers: ``true`` is not an ``integer`` or a ``number`` here, and ``integer`` takes no ``2.0``.
Keywords outside the subset are ignored.

>>> schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
>>> schema_error({"n": 3}, schema) is None
True
>>> schema_error({"n": "3"}, schema)
"argument 'n' must be an integer, got string '3'"
>>> schema_error({}, schema)
"missing required argument(s) ['n']"
"""

from __future__ import annotations

import json
from typing import Any

_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}
_ARTICLE = {"integer": "an integer", "array": "an array", "object": "an object", "null": "null"}


def json_type(value: Any) -> str:
    """The JSON type name of a parsed JSON value."""
    if isinstance(value, bool):
        return "boolean"
    for name in ("null", "string", "integer", "number", "array", "object"):
        if isinstance(value, _PYTHON_TYPES[name]):
            return name
    return type(value).__name__


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _PYTHON_TYPES.get(name, object))


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def schema_error(value: Any, schema: dict[str, Any], path: str = "") -> str | None:
    """Why ``value`` (a parsed tool-call ``arguments`` object, or a part of it at ``path``) does not fit
    ``schema``; None when it fits. The message names the argument (``'n'``, ``'items[2]'``, ``'point.x'``)."""
    where = f"argument {path!r}" if path else "arguments"
    types = schema.get("type")
    names = [types] if isinstance(types, str) else list(types or [])
    if names and not any(_is(value, n) for n in names):
        wanted = " or ".join(_ARTICLE.get(n, f"a {n}") for n in names)
        return f"{where} must be {wanted}, got {json_type(value)} {_show(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}, got {_show(value)}"
    if "const" in schema and value != schema["const"]:
        return f"{where} must be {_show(schema['const'])}, got {_show(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be <= {schema['maximum']}, got {value}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return f"{where} must have at least {schema['minLength']} characters, got {len(value)}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where} must have at most {schema['maxLength']} characters, got {len(value)}"
    if isinstance(value, list):
        return _array_error(value, schema, path, where)
    if isinstance(value, dict):
        return _object_error(value, schema, path)
    return None


def _array_error(value: list, schema: dict[str, Any], path: str, where: str) -> str | None:
    if len(value) < schema.get("minItems", 0):
        return f"{where} must have at least {schema['minItems']} items, got {len(value)}"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{where} must have at most {schema['maxItems']} items, got {len(value)}"
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            problem = schema_error(item, items, f"{path or 'arguments'}[{i}]")
            if problem:
                return problem
    return None


def _object_error(value: dict, schema: dict[str, Any], path: str) -> str | None:
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in value]
    inside = f" of {path!r}" if path else ""
    if missing:
        return f"missing required argument(s) {missing}{inside}"
    extra = schema.get("additionalProperties", False if not path else True)
    unknown = sorted(set(value) - set(props))
    if unknown and extra is False:
        return f"unknown argument(s) {unknown}{inside}; allowed: {sorted(props)}"
    for key, item in value.items():
        sub = props.get(key, extra if isinstance(extra, dict) else None)
        if sub:
            problem = schema_error(item, sub, f"{path}.{key}" if path else key)
            if problem:
                return problem
    return None
