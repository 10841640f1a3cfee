"""A user tool that never returns, for the no-hang tests: ``hang`` blocks forever on every other instance.

Importing this module registers the tool; the env type ``tests.agentic.hang_tool:tool_use`` (``tool_use`` reached
through this module) makes Ray env managers import it too. The ``hang`` tool of an even-numbered instance never returns
(it waits on an
event nobody sets); the others answer ``"ok"``. :data:`HANGING` holds the events, so a test can let them go.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from roll.envs.tool_use.tools import Tool, ToolResult, list_tools, register_tool

_instances = itertools.count()
HANGING: list[threading.Event] = []


class HangTool(Tool):
    """Never returns on even-numbered instances (a user bug: a blocking call without a timeout)."""

    name = "hang"
    description = "Wait for an answer (never comes on every other instance)."
    parameters = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.hangs = next(_instances) % 2 == 0

    def run(self, arguments: dict[str, Any]) -> ToolResult:
        if self.hangs:
            event = threading.Event()
            HANGING.append(event)
            event.wait()  # no timeout: the call returns only when a test sets the event
        return ToolResult(True, "ok")


if "hang" not in list_tools():
    register_tool(HangTool)
