"""Tools a model may call from :class:`~roll.envs.tool_use.env.ToolUseEnv`, and their registry.

Each tool is a class registered in :data:`TOOLS` with :func:`register_tool`; it carries a JSON-schema description
(``schema()``, the ``{"type": "function", "function": {...}}`` entry of the Qwen/Hermes ``<tools>``
block) and is called with the parsed ``arguments`` dict. A tool never raises for bad input: it returns a
:class:`ToolResult` with ``ok=False`` and a message the model can read.

Built-in tools: ``python`` (runs code in :func:`~roll.envs.tool_use.sandbox.run_python`) and
``calculator`` (safe arithmetic through :mod:`ast`; nothing is ever ``eval``-ed).
"""

from __future__ import annotations

import ast
import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from roll.envs.tool_use.sandbox import landlock_abi, run_python
from roll.envs.tool_use.schema import schema_error
from roll.registry import Registry


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced.

    Attributes:
        ok: the call succeeded.
        content: the text returned to the model (output, or an error message).
        timed_out: the call hit a time limit (counted by the env as ``sandbox_timeouts``).
    """

    ok: bool
    content: str
    timed_out: bool = False


class Tool(ABC):
    """A callable tool with a JSON-schema description."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: JSON schema of the ``arguments`` object.
    parameters: ClassVar[dict[str, Any]] = {}

    def schema(self) -> dict[str, Any]:
        """The tool's entry for the system prompt (OpenAI / Qwen / Hermes function format)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check_arguments(self, arguments: Any) -> str | None:
        """Return an error message if ``arguments`` does not fit ``parameters`` (its JSON schema: types, enums,
        required and unknown keys, nested arrays and objects; see :mod:`roll.envs.tool_use.schema`), else None."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        problem = schema_error(arguments, {"type": "object", **self.parameters})
        return f"{problem} (tool {self.name!r})" if problem else None

    @abstractmethod
    def run(self, arguments: dict[str, Any]) -> ToolResult:
        """Execute the tool on already-checked ``arguments``."""

    def __call__(self, arguments: Any) -> ToolResult:
        """Check ``arguments`` and run the tool; bad arguments give ``ToolResult(ok=False, ...)``."""
        problem = self.check_arguments(arguments)
        if problem is not None:
            return ToolResult(False, f"Error: {problem}.")
        return self.run(arguments)


#: tool name (its class attribute ``name``) -> tool class.
TOOLS: Registry[type[Tool]] = Registry(
    "tool", "register_tool", base=Tool, how_to_add="@register_tool on a Tool subclass with name = {name!r}"
)
ToolT = TypeVar("ToolT", bound=type[Tool])


def register_tool(cls: ToolT) -> ToolT:
    """Class decorator: register a :class:`Tool` subclass in :data:`TOOLS` under its ``name``.

    Raises:
        ValueError: the name is empty or already registered.
        TypeError: ``cls`` is not a ``Tool`` subclass.
    """
    if not getattr(cls, "name", ""):
        raise ValueError(f"{cls!r} needs a non-empty class attribute `name` to be registered.")
    TOOLS.register(cls.name)(cls)
    return cls


def list_tools() -> list[str]:
    """Names of all registered tools, sorted."""
    return TOOLS.names()


def make_tool(name: str, **kwargs: Any) -> Tool:
    """Instantiate the tool registered as ``name`` (or ``"package.module:name"``) with ``kwargs``.

    Raises:
        UnknownNameError: unknown name (a ``ValueError``); the message lists the registered tools.
        ImportError: the module of a ``"package.module:name"`` does not import.
    """
    return TOOLS.get(name)(**kwargs)


@register_tool
class PythonTool(Tool):
    """Run a Python snippet in the sandbox and return what it printed.

    Args:
        wall_timeout_s, cpu_time_s, memory_mb, max_output_bytes: sandbox limits (see ``run_python``).
    """

    name = "python"
    description = (
        "Execute Python 3 code (standard library only) in a sandbox and return its stdout. "
        "Use print() to see results. No network, no files outside the working directory, "
        "limited time and memory; state is not kept between calls."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source code to run."}},
        "required": ["code"],
    }

    def __init__(
        self, wall_timeout_s: float = 5.0, cpu_time_s: int = 5, memory_mb: int = 512, max_output_bytes: int = 4096
    ) -> None:
        self.limits = {
            "wall_timeout_s": wall_timeout_s,
            "cpu_time_s": cpu_time_s,
            "memory_mb": memory_mb,
            "max_output_bytes": max_output_bytes,
        }
        landlock_abi()  # probed once per process: a kernel without Landlock is announced now, at start

    def run(self, arguments: dict[str, Any]) -> ToolResult:
        """Run ``arguments["code"]``; on failure the content is the error plus stdout and stderr."""
        result = run_python(arguments["code"], **self.limits)
        if result.ok:
            return ToolResult(True, result.stdout if result.stdout else "(no output; use print())")
        parts = [f"Error: {result.error}"]
        if result.stdout:
            parts.append(f"stdout:\n{result.stdout}")
        if result.stderr and result.error != "memory limit":
            parts.append(f"stderr:\n{result.stderr}")
        return ToolResult(False, "\n".join(parts), timed_out=result.error in ("timeout", "cpu time limit"))


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"sqrt": math.sqrt, "abs": abs}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


class CalculatorError(ValueError):
    """A calculator expression that is not allowed or cannot be evaluated."""


@register_tool
class CalculatorTool(Tool):
    """Evaluate an arithmetic expression exactly (integers) or in floating point.

    Allowed: integer and decimal literals, ``+ - * / // % **``, parentheses, unary ``-``/``+``,
    ``sqrt(x)``, ``abs(x)``, ``pi``, ``e``. Integers may have at most ``max_int_bits`` bits, so a huge
    power such as ``9**9**9`` is refused before it is computed.
    """

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression, e.g. '(12345 * 6789) % 97'. Supports + - * / // % **, "
        "parentheses, sqrt(x), abs(x), pi and e. Integer arithmetic is exact."
    )
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The expression to evaluate."}},
        "required": ["expression"],
    }

    def __init__(self, max_int_bits: int = 4096, max_chars: int = 500) -> None:
        self.max_int_bits = max_int_bits
        self.max_chars = max_chars

    def run(self, arguments: dict[str, Any]) -> ToolResult:
        """Evaluate ``arguments["expression"]``; errors come back as ``ok=False`` with the reason."""
        try:
            return ToolResult(True, str(self.evaluate(arguments["expression"])))
        except CalculatorError as err:
            return ToolResult(False, f"Error: {err}")

    def evaluate(self, expression: str) -> int | float:
        """Return the value of ``expression``.

        Raises:
            CalculatorError: syntax not allowed, a bound exceeded, or an arithmetic error.
        """
        if len(expression) > self.max_chars:
            raise CalculatorError(f"expression has {len(expression)} characters; at most {self.max_chars}")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            raise CalculatorError(f"cannot parse {expression!r}: {type(err).__name__}") from None
        try:
            return self._eval(tree.body)
        except (ZeroDivisionError, OverflowError, ValueError, RecursionError) as err:
            if isinstance(err, CalculatorError):
                raise
            raise CalculatorError(f"{type(err).__name__}: {err}") from None

    def _eval(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._bounded(node.value)
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self._eval(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            return self._bounded(_BINARY[type(node.op)](left, right))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and len(node.args) == 1
            and not node.keywords
        ):
            return self._bounded(_FUNCTIONS[node.func.id](self._eval(node.args[0])))
        raise CalculatorError(
            f"{ast.unparse(node)!r} is not allowed; use numbers, + - * / // % **, parentheses, "
            f"{sorted(_FUNCTIONS)} and {sorted(_CONSTANTS)}"
        )

    def _check_power(self, base: int | float, exponent: int | float) -> None:
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
            if (abs(base).bit_length() - 1) * exponent > self.max_int_bits:
                raise CalculatorError(
                    f"{base}**{exponent} would exceed {self.max_int_bits} bits; use a smaller exponent"
                )
        if isinstance(exponent, complex) or abs(exponent) > 1e6:
            raise CalculatorError(f"exponent {exponent} is too large; at most 1e6 in magnitude")

    def _bounded(self, value: Any) -> int | float:
        if isinstance(value, complex):
            raise CalculatorError("the result is a complex number; only real results are supported")
        if isinstance(value, int) and value.bit_length() > self.max_int_bits:
            raise CalculatorError(f"an intermediate integer exceeds {self.max_int_bits} bits")
        return value
