"""ToolUseEnv, its tools (calculator, python) and tool-call parsing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from roll.envs import make_env
from roll.envs.tool_use import ToolUseEnv, list_tasks, make_tool, parse_tool_calls, register_tool
from roll.envs.tool_use.env import FORMAT_HELP, parse_integer
from roll.envs.tool_use.tasks import get_task_generator
from roll.envs.tool_use.tools import CalculatorTool, Tool


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


# ----------------------------------------------------------------- calculator
@pytest.mark.parametrize(
    "expression, expected",
    [
        ("2**10", 1024),
        ("(12345 * 6789) % 97", 71),
        ("7 // 2", 3),
        ("-3 % 5", 2),
        ("10 / 4", 2.5),
        ("sqrt(16)", 4.0),
        ("abs(-5)", 5),
        ("2 ** -1", 0.5),
        ("(1 + 2) * -3", -9),
        ("2 * pi", 2 * 3.141592653589793),
        ("123456789 * 987654321", 121932631112635269),
    ],
)
def test_calculator_values(expression, expected):
    assert CalculatorTool().evaluate(expression) == expected
    result = make_tool("calculator")({"expression": expression})
    assert result.ok and result.content == str(expected)


@pytest.mark.parametrize(
    "expression, message",
    [
        ("9**9**9", "bits"),
        ("2**100000", "bits"),
        ("10**5000", "bits"),
        ("(10**1000) ** 5", "bits"),
        ("__import__('os').system('ls')", "not allowed"),
        ("x + 1", "not allowed"),
        ("[1, 2]", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("True + 1", "not allowed"),
        ("1 if 1 else 2", "not allowed"),
        ("1 / 0", "ZeroDivisionError"),
        ("(-8) ** 0.5", "complex"),
        ("sqrt(-1)", "ValueError"),
        ("2.0 ** 10000", "OverflowError"),
        ("1 +", "cannot parse"),
        ("1" * 600, "characters"),
    ],
)
def test_calculator_refuses_tricky_inputs(expression, message):
    result = make_tool("calculator")({"expression": expression})
    assert not result.ok and result.content.startswith("Error:") and message in result.content


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({}, "missing required argument(s) ['expression']"),
        ({"expression": 3}, "must be a string"),
        ({"expression": "1", "x": 2}, "unknown argument(s) ['x']"),
        ([1], "must be a JSON object"),
    ],
)
def test_tool_argument_errors(arguments, message):
    result = make_tool("calculator")(arguments)
    assert not result.ok and message in result.content


def test_tool_registry_rejects_duplicates_and_lists_names():
    with pytest.raises(ValueError, match="already registered"):
        register_tool(type("Dup", (CalculatorTool,), {}))
    with pytest.raises(ValueError, match=r"unknown tool 'shell'; valid names: \['calculator', 'python'"):
        make_tool("shell")
    schema = make_tool("python").schema()
    assert schema["function"]["name"] == "python" and schema["function"]["parameters"]["required"] == ["code"]


def test_python_tool_output_and_errors():
    tool = make_tool("python", wall_timeout_s=1.0)
    assert tool({"code": "print(2 ** 100)"}).content == "1267650600228229401496703205376\n"
    failed = tool({"code": "print('partial')\nraise ValueError('bad')"})
    assert not failed.ok and not failed.timed_out
    assert failed.content.startswith("Error: ValueError: bad\nstdout:\npartial")
    slow = tool({"code": "while True:\n    pass"})
    assert (slow.ok, slow.timed_out, slow.content) == (False, True, "Error: timeout")
    assert isinstance(tool, Tool)


# ----------------------------------------------------------------- parsing
def test_parse_tool_calls_variants():
    text = 'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    assert parse_tool_calls(text) == [("python", {"code": "print(1)"})]
    stringified = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
    assert parse_tool_calls(stringified) == [("calculator", {"expression": "1+1"})]
    fenced = '<TOOL_CALL>```json\n{"name": "calculator", "arguments": {"expression": "2"}}\n```</TOOL_CALL>'
    assert parse_tool_calls(fenced) == [("calculator", {"expression": "2"})]
    unclosed = '<tool_call>{"name": "calculator", "arguments": {"expression": "3"}}'
    assert parse_tool_calls(unclosed) == [("calculator", {"expression": "3"})]


@pytest.mark.parametrize(
    "text, message",
    [
        ("<tool_call>{name: python}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'string "name"'),
        ('<tool_call>["python"]</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "python"}</tool_call>', '"arguments" JSON object'),
        ('<tool_call>{"name": "python", "arguments": "code"}</tool_call>', "not a JSON object"),
    ],
)
def test_parse_tool_calls_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_tool_calls(text)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1234", 1234),
        ("1,234", 1234),
        (" 1 234 ", 1234),
        ("-17", -17),
        ("1234.", 1234),
        ("1234.0", 1234),
        ("12.5", None),
        ("twelve", None),
        ("", None),
    ],
)
def test_parse_integer(text, value):
    assert parse_integer(text) == value


# ----------------------------------------------------------------- tasks
def _primes_below(n: int) -> int:
    return sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n))


def test_task_answers_match_independent_computation():
    for seed in range(3):
        task = get_task_generator("count_primes")(np.random.default_rng(seed))
        n = int(re.search(r"less than (\d+)", task.question).group(1))
        assert task.answer == _primes_below(n)
        task = get_task_generator("modpow")(np.random.default_rng(seed))
        a, b, m = map(int, re.search(r"What is (\d+)\*\*(\d+) mod (\d+)", task.question).groups())
        assert task.answer == pow(a, b, m)
    task = get_task_generator("collatz_steps")(np.random.default_rng(0))
    n, steps = int(re.search(r"from (\d+)", task.question).group(1)), 0
    while n != 1:
        n, steps = (n // 2 if n % 2 == 0 else 3 * n + 1), steps + 1
    assert task.answer == steps


# ----------------------------------------------------------------- env
def test_check_env_and_registry():
    check_env(ToolUseEnv(), skip_render_check=True)
    env = make_env("tool_use", {"tasks": ["multiply"], "max_steps": 3})
    assert isinstance(env, ToolUseEnv) and env.max_steps == 3


def test_reset_is_deterministic_per_seed():
    questions = [ToolUseEnv().reset(seed=s)[0] for s in range(8)]
    assert questions == [ToolUseEnv().reset(seed=s)[0] for s in range(8)]
    assert len(set(questions)) == 8
    env = ToolUseEnv()
    first = env.reset(seed=5)[0]
    env.reset(seed=6)
    assert env.reset(seed=5)[0] == first


def test_instruction_lists_tools_and_format():
    env = ToolUseEnv(tools=["calculator"], max_steps=4)
    _, info = env.reset(seed=0)
    instruction = info["env_instruction"]
    assert '"name": "calculator"' in instruction and '"name": "python"' not in instruction
    assert "<tool_call>" in instruction and "<answer>N</answer>" in instruction and "4 turns" in instruction
    assert info["message_role"] == "user"


def test_scripted_episode_python_then_correct_answer():
    env = ToolUseEnv(max_steps=3)
    question, _ = env.reset(seed=1, options={"task": "multiply"})
    a, b = map(int, re.findall(r"\d+", question))
    obs, reward, terminated, truncated, info = env.step(
        "I will compute it. " + call("python", code=f"print({a} * {b})")
    )
    assert obs == f"{a * b}\n" and reward == 0.0 and not terminated and not truncated
    assert info["message_role"] == "tool" and info["action_is_valid"]
    assert info["tool_results"] == [{"name": "python", "ok": True}]
    obs, reward, terminated, truncated, info = env.step(f"<answer>{obs.strip()}</answer>")
    assert (reward, terminated, truncated, info["success"], info["message_role"]) == (1.0, True, False, True, "user")
    assert info["metrics"]["tool_calls"] == 1.0 and info["metrics"]["tool_errors"] == 0.0


def test_wrong_answer_terminates_with_zero():
    env = ToolUseEnv()
    env.reset(seed=2)
    _, reward, terminated, _, info = env.step(f"<answer>{env.task.answer + 1}</answer>")
    assert (reward, terminated, info["success"], info["answer"]) == (0.0, True, False, env.task.answer)


@pytest.mark.parametrize(
    "action, role, message",
    [
        ("<tool_call>{not json}</tool_call>", "tool", "not valid JSON"),
        (call("shell", cmd="ls"), "tool", "unknown tool 'shell'; available tools: ['calculator', 'python']"),
        (call("python"), "tool", "missing required argument(s) ['code']"),
        (call("calculator", expression="1") * 2, "tool", "2 tool calls in one turn; at most 1"),
        ("the answer is 5", "user", FORMAT_HELP),
    ],
)
def test_bad_tool_calls_cost_format_penalty_and_are_counted(action, role, message):
    env = ToolUseEnv(format_penalty=-0.25)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert message in obs and info["message_role"] == role
    assert (reward, terminated, truncated, info["action_is_valid"]) == (-0.25, False, False, False)
    assert info["metrics"]["invalid_actions"] == 1.0
    assert info["metrics"]["tool_errors"] == (1.0 if role == "tool" else 0.0)
    assert info["metrics"]["tool_calls"] == 0.0


def test_sandbox_timeout_counted_and_budget_ends_episode():
    env = ToolUseEnv(max_steps=2, sandbox_timeout_s=0.5)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(call("python", code="while True:\n    pass"))
    assert obs == "Error: timeout" and reward == 0.0 and not terminated
    assert info["metrics"]["sandbox_timeouts"] == 1.0 and info["metrics"]["tool_errors"] == 1.0
    _, reward, terminated, truncated, info = env.step(call("calculator", expression="1+1"))
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    with pytest.raises(RuntimeError):
        env.step("<answer>1</answer>")


def test_long_or_unprintable_tool_output_is_clipped():
    env = ToolUseEnv(max_tool_output_chars=300)
    env.reset(seed=0)
    obs, *_ = env.step(call("python", code="print('\\u00e9' + 'a' * 3000)"))
    assert obs.startswith("?aaa") and "[output cut: 3002 characters in total]" in obs
    assert env.observation_space.contains(obs)


def test_unknown_task_lists_names():
    with pytest.raises(ValueError, match=re.escape(f"unknown tool_use task 'integrals'; valid names: {list_tasks()}")):
        ToolUseEnv(tasks=["integrals"])
