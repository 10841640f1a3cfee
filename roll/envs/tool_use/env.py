"""ToolUseEnv: answer a computation question, calling sandboxed tools in the Qwen/Hermes format."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from typing import Any, SupportsFloat

import numpy as np

from roll.envs.base import MAX_OBSERVATION_CHARS, Observation, TextEnv, Transition
from roll.envs.parsing import ActionParser
from roll.envs.registry import register_env
from roll.envs.tool_use.tasks import Task, get_task_generator, list_tasks
from roll.envs.tool_use.tools import TOOLS, Tool, ToolResult, make_tool

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL | re.IGNORECASE)
_TOOL_CALL_OPEN = re.compile(r"<tool_call>", re.IGNORECASE)
_CODE_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.DOTALL)
_PRINTABLE = frozenset(string.printable)
FORMAT_HELP = (
    'Invalid format. Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call> '
    "or give the final answer as <answer>integer</answer>."
)


class ToolCallFirstParser(ActionParser):
    """An :class:`ActionParser` that returns the tool-call block(s) when the text holds any.

    Text with ``<tool_call>`` yields the text from the first ``<tool_call>`` on (a tool turn, even if an
    answer follows); other text is parsed for the answer as usual.
    """

    def parse(self, text: str) -> str | None:
        """Return ``"<tool_call>..."`` for a tool turn, else the answer (or ``None``)."""
        if isinstance(text, str):
            match = _TOOL_CALL_OPEN.search(text)
            if match is not None:
                return text[match.start() :].strip()
        return super().parse(text)


def parse_tool_calls(text: str) -> list[tuple[str, Any]]:
    """Parse every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block in ``text``.

    ``arguments`` may also be a JSON string holding an object (OpenAI style); a Markdown code fence
    around the JSON is tolerated.

    Returns:
        ``[(name, arguments), ...]``.

    Raises:
        ValueError: a block is not valid JSON or lacks a string ``name`` / an object ``arguments``.
    """
    calls = []
    for body in _TOOL_CALL.findall(text):
        fenced = _CODE_FENCE.match(body)
        body = fenced.group(1) if fenced else body
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as err:
            raise ValueError(f"the tool call is not valid JSON ({err.msg} at position {err.pos})") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            raise ValueError('the tool call must be a JSON object with a string "name"')
        arguments = payload.get("arguments", payload.get("parameters"))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                raise ValueError('"arguments" is a string that is not a JSON object') from None
        if not isinstance(arguments, dict):
            raise ValueError('the tool call needs an "arguments" JSON object')
        calls.append((payload["name"], arguments))
    return calls


def parse_integer(text: str) -> int | None:
    """Read an integer answer: ``"1,234"``, ``"1 234"``, ``"1234."`` and ``"1234.0"`` give 1234."""
    cleaned = re.sub(r"[\s,_]", "", text).rstrip(".")
    if re.fullmatch(r"[+-]?\d+", cleaned):
        return int(cleaned)
    if re.fullmatch(r"[+-]?\d+\.0+", cleaned):
        return int(cleaned.split(".")[0])
    return None


@register_env("tool_use")
class ToolUseEnv(TextEnv):
    """Answer a computation question, optionally calling tools (Python sandbox, calculator) first.

    Action space:
        Raw model text. A tool turn holds one or more
        ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>`` blocks (at most
        ``max_calls_per_turn``); an answer turn holds ``<answer>integer</answer>`` (``action_format``).
        A tool turn takes precedence when both appear.

    Observation space:
        Printable ASCII text: the question after ``reset``; after a tool turn the tool output(s), with
        ``info["message_role"] == "tool"``; after a malformed turn an error message.

    Starting state:
        A task drawn from ``tasks`` with the seeded generator (``options={"task": name}`` forces one).

    Rewards:
        1.0 for a correct answer, 0.0 for a wrong one or a well-formed tool call, ``format_penalty`` for a
        turn that holds neither a well-formed tool call nor an answer (bad JSON, unknown tool, missing or
        wrong arguments, too many calls, no tags).

    Episode end:
        Terminated by the answer (right or wrong), or after ``max_steps`` turns (tool calls plus the
        answer) without an answer (``max_steps_terminates``: the turn budget is a rule of the task).

    Info:
        Base keys, plus ``tool_results`` (list of ``{"name", "ok"}``) after a tool turn and ``answer``
        (the expected integer) after the answer. ``metrics``: ``tool_calls`` (executed calls),
        ``tool_errors`` (malformed calls plus calls that returned an error), ``sandbox_timeouts``.

    Args:
        tasks: task generator names (see ``tasks.list_tasks()``); ``None`` = all.
        tools: tool names offered to the model (see ``tools.list_tools()``).
        max_steps, format_penalty, action_format, render_mode: see :class:`~roll.envs.base.TextEnv`.
        max_calls_per_turn: tool calls allowed in one turn.
        max_tool_output_chars: longer tool output is cut (with a note) before it becomes the observation.
        sandbox_timeout_s, sandbox_memory_mb: limits of the ``python`` tool.
    """

    #: Running out of turns is a rule of the task (no answer = failure), so it terminates the episode.
    max_steps_terminates = True

    def __init__(
        self,
        tasks: Sequence[str] | None = None,
        tools: Sequence[str] = ("python", "calculator"),
        max_steps: int = 5,
        format_penalty: float = -0.1,
        action_format: str = "answer",
        max_calls_per_turn: int = 1,
        max_tool_output_chars: int = 2000,
        sandbox_timeout_s: float = 5.0,
        sandbox_memory_mb: int = 512,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_steps=max_steps, format_penalty=format_penalty, action_format=action_format, render_mode=render_mode
        )
        self.parser = ToolCallFirstParser(action_format)
        self.task_names = list(tasks) if tasks is not None else list_tasks()
        if not self.task_names:
            raise ValueError(f"tasks={tasks!r} is empty; pass None for all tasks or some of {list_tasks()}.")
        self._generators = [get_task_generator(name) for name in self.task_names]
        if max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn={max_calls_per_turn!r} must be >= 1.")
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.max_tool_output_chars = min(int(max_tool_output_chars), MAX_OBSERVATION_CHARS - 200)
        self.tools: dict[str, Tool] = {}
        for name in map(TOOLS.resolve, tools):  # "package.module:name" -> the name the model calls
            kwargs = {"wall_timeout_s": sandbox_timeout_s, "memory_mb": sandbox_memory_mb} if name == "python" else {}
            self.tools[name] = make_tool(name, **kwargs)
        self.task: Task | None = None
        self._feedback = ""
        self._pending_calls: list[tuple[str, dict[str, Any]]] = []
        self._counts = {"tool_calls": 0, "tool_errors": 0, "sandbox_timeouts": 0}

    # ----------------------------------------------------------------- TextEnv hooks
    def instruction(self) -> str:
        """Task rules with the tool schemas in a Hermes-style ``<tools>`` block."""
        schemas = "\n".join(json.dumps(tool.schema()) for tool in self.tools.values())
        return (
            "Solve the computation task. You may call tools; each call's result comes back in the next message.\n"
            f"Available tools:\n<tools>\n{schemas}\n</tools>\n"
            "To call a tool, reply with exactly one block:\n"
            '<tool_call>{"name": <tool-name>, "arguments": <arguments-json-object>}</tool_call>\n'
            "When you know the result, reply with the final integer as <answer>N</answer>.\n"
            f"You have {self.max_steps} turns in total (tool calls plus the answer)."
        )

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        if "task" in options:
            generator = get_task_generator(options["task"])
        else:
            generator = self._generators[int(rng.integers(len(self._generators)))]
        self.task = generator(rng)
        self._counts = dict.fromkeys(self._counts, 0)
        self._feedback = self.task.question
        self.message_role = "user"
        return self._feedback

    def step(self, action: str) -> tuple[str | Observation, SupportsFloat, bool, bool, dict[str, Any]]:
        """As :meth:`TextEnv.step`; a tool turn answers with ``info["message_role"] == "tool"``."""
        self._feedback = FORMAT_HELP
        self.message_role = "user"
        return super().step(action)

    def _canonical_action(self, parsed: str) -> str | None:
        if not _TOOL_CALL_OPEN.match(parsed):
            return parsed
        self.message_role = "tool"
        try:
            calls = parse_tool_calls(parsed)
            if len(calls) > self.max_calls_per_turn:
                raise ValueError(f"{len(calls)} tool calls in one turn; at most {self.max_calls_per_turn}")
            for name, arguments in calls:
                if name not in self.tools:
                    raise ValueError(f"unknown tool {name!r}; available tools: {sorted(self.tools)}")
                problem = self.tools[name].check_arguments(arguments)
                if problem is not None:
                    raise ValueError(problem)
        except ValueError as err:
            self._counts["tool_errors"] += 1
            self._feedback = f"Error: {err}."
            return None
        self._pending_calls = calls
        return "<tool_call>"

    def _apply(self, action: str) -> Transition:
        if action == "<tool_call>":
            return self._run_tools()
        assert self.task is not None
        value = parse_integer(action)
        correct = value == self.task.answer
        self._feedback = f"Your answer {action!r} is {'correct' if correct else 'incorrect'}."
        return Transition(
            self._feedback, 1.0 if correct else 0.0, True, success=correct, info={"answer": self.task.answer}
        )

    def _run_tools(self) -> Transition:
        outputs, results = [], []
        for name, arguments in self._pending_calls:
            result: ToolResult = self.tools[name](arguments)
            self._counts["tool_calls"] += 1
            self._counts["tool_errors"] += int(not result.ok)
            self._counts["sandbox_timeouts"] += int(result.timed_out)
            outputs.append(self._clip(result.content))
            results.append({"name": name, "ok": result.ok})
        self._pending_calls = []
        self._feedback = "\n\n".join(outputs)
        return Transition(self._feedback, 0.0, False, info={"tool_results": results})

    def _clip(self, text: str) -> str:
        text = "".join(c if c in _PRINTABLE else "?" for c in text)
        limit = max(self.max_tool_output_chars // max(self.max_calls_per_turn, 1), 100)
        if len(text) > limit:
            text = text[:limit] + f"\n... [output cut: {len(text)} characters in total]"
        return text

    def _observation(self) -> str:
        return self._feedback

    def _metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._counts.items()}
