"""Tool-call parsers: the model's reply text -> OpenAI ``tool_calls``, one registry entry per model family.

A parser takes the reply text (end-of-turn token removed) and returns :class:`ParsedReply`: the text left for
``content`` and the calls found. A call that does not parse (bad JSON, no name, or a block opened and never closed:
a reply cut by its token budget) is left in ``content`` and counted in ``errors`` (the harness sees what the model
wrote; the trajectory keeps the ids either way). The gateway also counts a call of a function the request did not
offer.

Built in: ``hermes`` (alias ``qwen2_5``, ``qwen3``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, as Hermes-style and Qwen2.5/Qwen3 chat templates render tool calls. Add a family with
``@register_tool_parser("name")`` and set ``custom_envs.<tag>.tool_parser``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll.registry import Registry


@dataclass
class ToolCall:
    """One parsed call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedReply:
    """``content``: the reply text without the parsed calls (None when nothing is left); ``calls`` in order;
    ``errors``: blocks that looked like calls but did not parse."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    errors: int = 0


class ToolParser(Protocol):
    """Every parser's signature."""

    def __call__(self, text: str) -> ParsedReply: ...


TOOL_PARSERS: Registry[ToolParser] = Registry("tool-call parser", "register_tool_parser")
register_tool_parser = TOOL_PARSERS.register

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register_tool_parser("hermes", "qwen2_5", "qwen3")
def parse_hermes(text: str) -> ParsedReply:
    """``<tool_call>{"name": str, "arguments": object}</tool_call>`` blocks (whitespace around the JSON allowed).

    >>> parse_hermes('Let me look.<tool_call>\\n{"name": "push", "arguments": {"dir": "up"}}\\n</tool_call>')
    ParsedReply(content='Let me look.', calls=[ToolCall(name='push', arguments={'dir': 'up'})], errors=0)
    >>> parse_hermes('<tool_call>{"name": "push", "argu')  # cut by the token budget
    ParsedReply(content='<tool_call>{"name": "push", "argu', calls=[], errors=1)
    """
    calls, kept, errors, last = [], [], 0, 0
    closed = 0
    for match in _HERMES.finditer(text):
        closed = match.end()
        try:
            obj = json.loads(match.group(1))
            name, arguments = obj["name"], obj.get("arguments", {})
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                arguments = json.loads(arguments)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise ValueError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError):
            errors += 1
            continue  # left in content below
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(ToolCall(name, arguments))
    kept.append(text[last:])
    errors += "<tool_call>" in text[closed:]  # a call opened after the last closed one and never closed
    content = "".join(kept).strip() if calls else text
    return ParsedReply(content or None, calls, errors)
