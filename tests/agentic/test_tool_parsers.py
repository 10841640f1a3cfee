"""Tool-call parsers: the hermes/Qwen format by hand, and the registry's lookups."""

from __future__ import annotations

import pytest

from roll.agentic.gateway.tool_parsers import TOOL_PARSERS, ParsedReply, ToolCall, parse_hermes, register_tool_parser


def test_hermes_calls_content_and_errors():
    text = (
        'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "mul", "arguments": "{\\"x\\": 3}"}</tool_call>'
        '<tool_call>{"name": "broken", "arguments": </tool_call>'
    )
    parsed = parse_hermes(text)
    assert parsed.calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("mul", {"x": 3})]
    assert parsed.errors == 1
    assert parsed.content == 'I will add.\n\n<tool_call>{"name": "broken", "arguments": </tool_call>'
    assert parse_hermes("just text") == ParsedReply("just text", [], 0)
    assert parse_hermes("") == ParsedReply(None, [], 0)
    only = parse_hermes('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert only.content is None and only.calls == [ToolCall("f", {})]
    assert parse_hermes('<tool_call>{"name": 3, "arguments": {}}</tool_call>').errors == 1  # a name is a string


def test_registry_aliases_and_a_clear_unknown_name():
    assert TOOL_PARSERS.get("qwen2_5") is parse_hermes is TOOL_PARSERS.get("qwen3")
    with pytest.raises(KeyError, match="valid names: .*hermes"):
        TOOL_PARSERS.get("mistral")

    @register_tool_parser("test_upper")
    def upper(text: str) -> ParsedReply:
        return ParsedReply(text.upper())

    try:
        assert TOOL_PARSERS.get("test_upper")("a").content == "A"
    finally:
        TOOL_PARSERS.unregister("test_upper")
