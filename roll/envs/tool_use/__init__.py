"""Tool-use environment: the model calls a sandboxed Python tool or a calculator, then answers.

Importing this package registers the ``tool_use`` env. See ``docs/tool_use.md``.
"""

from roll.envs.tool_use.env import ToolUseEnv, parse_tool_calls
from roll.envs.tool_use.sandbox import SandboxResult, run_python
from roll.envs.tool_use.tasks import TASKS, Task, list_tasks, register_task
from roll.envs.tool_use.tools import TOOLS, Tool, ToolResult, list_tools, make_tool, register_tool

__all__ = [
    "TASKS",
    "TOOLS",
    "SandboxResult",
    "Task",
    "Tool",
    "ToolResult",
    "ToolUseEnv",
    "list_tasks",
    "list_tools",
    "make_tool",
    "parse_tool_calls",
    "register_task",
    "register_tool",
    "run_python",
]
