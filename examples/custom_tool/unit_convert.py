"""A user tool and a user task generator for the tool-use env (docs/tool_use.md, "Writing a tool" and "Writing a
task generator"): the model converts lengths with a ``unit_convert`` tool, then answers with an integer.

Importing this module registers both; a config names the env as ``examples.custom_tool.unit_convert:tool_use``
so that every process that builds the env (the driver, Ray env managers) imports it first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from roll.envs.tool_use import Task, Tool, ToolResult, register_task, register_tool

MM_PER_UNIT = {"mm": 1, "cm": 10, "m": 1000, "km": 1_000_000}


@register_tool
class UnitConvertTool(Tool):
    """Convert a length between mm, cm, m and km (exact for whole results)."""

    name = "unit_convert"
    description = "Convert a length from one unit to another (mm, cm, m, km)."
    parameters = {
        "type": "object",
        "properties": {
            "value": {"type": "number", "description": "The length to convert."},
            "from_unit": {"type": "string", "enum": list(MM_PER_UNIT)},
            "to_unit": {"type": "string", "enum": list(MM_PER_UNIT)},
        },
        "required": ["value", "from_unit", "to_unit"],
    }

    def run(self, arguments: dict[str, Any]) -> ToolResult:
        """Called only with arguments that fit ``parameters`` (the env checks them first)."""
        mm = arguments["value"] * MM_PER_UNIT[arguments["from_unit"]]
        value = mm / MM_PER_UNIT[arguments["to_unit"]]
        text = str(int(value)) if float(value).is_integer() else repr(value)
        return ToolResult(True, f"{text} {arguments['to_unit']}")


@register_task("convert_length")
def convert_length(rng: np.random.Generator) -> Task:
    """A sum of kilometres and metres, asked in centimetres (the answer is an exact integer)."""
    km, m = int(rng.integers(2, 90)), int(rng.integers(1, 999))
    return Task("convert_length", f"How many centimetres are {km} km plus {m} m?", km * 100_000 + m * 100)
