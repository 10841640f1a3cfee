"""Agent runners for the ProxyEnvManager tests: the openai-only harness as a plain function, with injected crashes
and hangs (by (group, env) slot), and a log of what a hung harness got once its session was closed."""

from __future__ import annotations

import threading

import openai

from roll.agentic.gateway.runners import AgentResult, AgentTask
from tests.agentic.gateway_harness import play

LATE: list[str] = []  # what the requests of abandoned (hung) harnesses got
LOCK = threading.Lock()


def harness(task: AgentTask, turns: int = 2, crash: list | None = None, hang: list | None = None) -> AgentResult:
    slot = [task.group_id % 1000, task.env_id]
    if slot in (crash or []):
        raise ValueError(f"harness crashed on seed {task.seed}")
    if slot in (hang or []):
        threading.Event().wait(task.timeout_s * 1.5)
        try:
            play(task.base_url, task.api_key, task.seed, turns=1)
            outcome = "answered"
        except openai.AuthenticationError:
            outcome = "401"
        with LOCK:
            LATE.append(outcome)
        return AgentResult(0.0)
    log = play(task.base_url, task.api_key, task.seed, turns=turns)
    return AgentResult(reward=float(task.seed % 2), metrics={"calls": float(len(log))})
