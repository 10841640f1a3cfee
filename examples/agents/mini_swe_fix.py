"""Bug fixing with mini-swe-agent (``mini-swe-agent``), trained through roll's gateway.

Each episode gets a generated toy repository (``calc.py`` with one seeded bug, ``test_calc.py`` that fails on it)
and mini-swe-agent's ``DefaultAgent`` with its tool-calling model class (``LitellmModel``: a ``bash`` tool) pointed at
the gateway. Its shell commands run in roll's sandbox (:class:`examples.agents.sandbox_shell.SandboxShell`), never
on the host. Reward: 1 when ``python test_calc.py`` passes afterwards (run in the sandbox too).

The harness configures mini-swe-agent and litellm and nothing else: the model name ``openai/<model>`` with the
gateway's ``api_base`` and the episode's key; litellm's bundled model-cost map instead of a download
(``LITELLM_LOCAL_MODEL_COST_MAP``), no cost tracking (a local model has no price), one attempt per model call (a
refused call is not retried with back-off), no start-up banner. docs/agents_mini_swe_agent.md walks through it; its
config is ``examples/config/mini_swe_tiny.yaml``.
"""

from __future__ import annotations

import difflib
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported: no download at import
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")

import litellm  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

from examples.agents.sandbox_shell import SandboxShell  # noqa: E402
from roll.agentic.gateway.runners import AgentResult, AgentTask  # noqa: E402

litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners on errors
litellm.telemetry = False

#: (function, correct body, buggy body, test cases (a, b, expected)): the seed picks the buggy one.
FUNCTIONS = [
    ("add", "a + b", "a - b", [(2, 3, 5), (0, 4, 4)]),
    ("subtract", "a - b", "b - a", [(5, 3, 2), (9, 4, 5)]),
    ("multiply", "a * b", "a + b", [(3, 4, 12), (2, 5, 10)]),
    ("largest", "max(a, b)", "min(a, b)", [(3, 7, 7), (9, 2, 9)]),
]

SYSTEM = "You fix bugs in a Python repository. Call the bash tool with one shell command per reply."
INSTANCE = (
    "{{task}}\nRun `python test_calc.py` to check. When the tests pass, run: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
)


def toy_repository(seed: int) -> tuple[dict[str, str], str]:
    """``({path: text}, the fixed line)``: ``calc.py`` with the bug of ``seed`` and its failing ``test_calc.py``."""
    buggy = seed % len(FUNCTIONS)
    calc, tests = [], ["from calc import *\n"]
    for k, (name, right, wrong, cases) in enumerate(FUNCTIONS):
        calc.append(f"def {name}(a, b):\n    return {wrong if k == buggy else right}\n")
        tests += [f"assert {name}({a}, {b}) == {want}, '{name}({a}, {b}) should be {want}'\n" for a, b, want in cases]
    tests.append("print('all tests pass')\n")
    return {"calc.py": "\n\n".join(calc), "test_calc.py": "".join(tests)}, f"return {FUNCTIONS[buggy][1]}"


def _reply_text(message: dict) -> str:
    """The model's text in a message of mini-swe-agent's history: an assistant message, or the raw response kept
    with a format error (a reply without a usable tool call is not added as an assistant message)."""
    if message.get("role") == "assistant":
        return str(message.get("content") or "")
    response = message.get("extra", {}).get("response")
    if isinstance(response, dict) and response.get("choices"):
        return str(response["choices"][0].get("message", {}).get("content") or "")
    return ""


def fix(task: AgentTask, shaping: float = 0.5, command_timeout: float = 20.0) -> AgentResult:
    """One episode. Reward: 1 when the tests pass, else up to ``shaping`` by how close the model's best reply came to
    the fixed line (so that a model that cannot fix anything yet still learns; set 0 for a model that can)."""
    files, fixed_line = toy_repository(task.seed)  # the episodes of a group share the seed: the same bug
    shell = SandboxShell(files, timeout=command_timeout)
    model = LitellmModel(
        model_name=f"openai/{task.model}",
        model_kwargs={"api_base": task.base_url, "api_key": task.api_key},
        cost_tracking="ignore_errors",
    )
    agent = DefaultAgent(
        model,
        shell,
        system_template=SYSTEM,
        instance_template=INSTANCE,
        step_limit=task.max_turns,  # mini-swe-agent's own limit: it never asks for a turn past the gateway's
        cost_limit=0.0,
    )
    exit_status = agent.run("The tests in test_calc.py fail. Fix calc.py.").get("exit_status", "")
    if (
        SandboxShell(shell.files, timeout=command_timeout).execute({"command": "python test_calc.py"})["returncode"]
        == 0
    ):
        return AgentResult(1.0, success=True, metrics={"commands": float(len(shell.commands))})
    replies = [command for command, _ in shell.commands] + [_reply_text(m) for m in agent.messages]
    closeness = max((difflib.SequenceMatcher(None, r, fixed_line).ratio() for r in replies), default=0.0)
    return AgentResult(
        shaping * closeness,
        success=False,
        metrics={"commands": float(len(shell.commands)), "format_exit": float(exit_status == "RepeatedFormatError")},
    )
