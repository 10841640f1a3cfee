"""Tool arguments are checked against their JSON schema for every type (integer, number, boolean, string, array,
object, null, enum, required, nested), with a message naming the argument; the module's doctest runs too."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

from roll.envs.tool_use import schema as schema_module
from roll.envs.tool_use.schema import schema_error
from roll.envs.tool_use.tools import Tool, ToolResult

SCHEMA = {
    "type": "object",
    "required": ["n"],
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 100},
        "x": {"type": "number"},
        "flag": {"type": "boolean"},
        "name": {"type": "string", "maxLength": 5},
        "unit": {"type": "string", "enum": ["m", "s"]},
        "xs": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x"],
        },
        "maybe": {"type": ["string", "null"]},
    },
}


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {
                "n": 3,
                "x": 2.5,
                "flag": True,
                "name": "ab",
                "unit": "m",
                "xs": [1, 2],
                "point": {"x": 1, "y": 2.0},
                "maybe": None,
            },
            None,
        ),
        ({"n": 3, "x": 2, "maybe": "text"}, None),  # an integer is a number
        ({}, "missing required argument(s) ['n']"),
        (
            {"n": 3, "z": 1},
            "unknown argument(s) ['z']; allowed: ['flag', 'maybe', 'n', 'name', 'point', 'unit', 'x', 'xs']",
        ),
        ({"n": "3"}, "argument 'n' must be an integer, got string '3'"),
        ({"n": 2.0}, "argument 'n' must be an integer, got number 2.0"),
        ({"n": True}, "argument 'n' must be an integer, got boolean true"),
        ({"n": 0}, "argument 'n' must be >= 1, got 0"),
        ({"n": 101}, "argument 'n' must be <= 100, got 101"),
        ({"n": 1, "x": "1.5"}, "argument 'x' must be a number, got string '1.5'"),
        ({"n": 1, "x": False}, "argument 'x' must be a number, got boolean false"),
        ({"n": 1, "flag": 1}, "argument 'flag' must be a boolean, got integer 1"),
        ({"n": 1, "flag": "true"}, "argument 'flag' must be a boolean, got string 'true'"),
        ({"n": 1, "name": 5}, "argument 'name' must be a string, got integer 5"),
        ({"n": 1, "name": "abcdef"}, "argument 'name' must have at most 5 characters, got 6"),
        ({"n": 1, "unit": "kg"}, "argument 'unit' must be one of ['m', 's'], got 'kg'"),
        ({"n": 1, "xs": 3}, "argument 'xs' must be an array, got integer 3"),
        ({"n": 1, "xs": [1, "2"]}, "argument 'xs[1]' must be an integer, got string '2'"),
        ({"n": 1, "xs": [1, 2, 3, 4]}, "argument 'xs' must have at most 3 items, got 4"),
        ({"n": 1, "point": [1, 2]}, "argument 'point' must be an object, got array [1, 2]"),
        ({"n": 1, "point": {"y": 1}}, "missing required argument(s) ['x'] of 'point'"),
        ({"n": 1, "point": {"x": "a"}}, "argument 'point.x' must be a number, got string 'a'"),
        ({"n": 1, "maybe": 3}, "argument 'maybe' must be a string or null, got integer 3"),
    ],
)
def test_every_type_is_checked(arguments: dict[str, Any], message: str | None):
    assert schema_error(arguments, SCHEMA) == message


def test_a_tool_refuses_wrong_arguments_without_running():
    class Scale(Tool):
        name, description, parameters = "scale_test", "Scale a vector.", SCHEMA
        runs = 0

        def run(self, arguments: dict[str, Any]) -> ToolResult:
            Scale.runs += 1
            return ToolResult(True, str([arguments["n"] * v for v in arguments.get("xs", [])]))

    tool = Scale()
    assert tool({"n": 2, "xs": [1, 2]}) == ToolResult(True, "[2, 4]")
    bad = tool({"n": 2, "xs": [1, "2"]})
    assert bad == ToolResult(False, "Error: argument 'xs[1]' must be an integer, got string '2' (tool 'scale_test').")
    assert Scale.runs == 1


def test_module_doctest():
    assert doctest.testmod(schema_module).failed == 0
