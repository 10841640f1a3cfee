"""Agent runners for the ProxyEnvManager tests: the openai-only harness as a plain function, with injected crashes
and hangs (by (group, env) slot), and a log of what a hung harness got once its session was closed."""

from __future__ import annotations

import threading

import openai

from roll.agentic.gateway.runners import AgentResult, AgentTask
from tests.agentic.gateway_harness import TOOLS, play

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


def jittery(task: AgentTask, turns: int = 3) -> AgentResult:
    """Three model calls with a random pause (0-60 ms, from the clock, not the seed) before each: the order in which
    the requests of a turn reach the gateway changes from run to run."""
    import random
    import time

    rng = random.Random(time.perf_counter_ns())
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": f"Count from {task.seed % 97}."}]
    for _ in range(turns):
        time.sleep(rng.random() * 0.06)
        text = client.chat.completions.create(model=task.model, messages=messages).choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
    return AgentResult(float(len(text) % 3))


def always_raises(task: AgentTask) -> AgentResult:
    """Fails every episode the same way, after one model call."""
    play(task.base_url, task.api_key, task.seed, turns=1)
    raise RuntimeError(f"no tool named 'search' (seed {task.seed})")


def always_hangs(task: AgentTask) -> AgentResult:
    """Never returns within the episode's time (it waits twice ``agent_timeout``)."""
    threading.Event().wait(task.timeout_s * 2)
    return AgentResult(0.0)


def greedy(task: AgentTask, catch: bool = False) -> float | None:
    """Ignores ``task.max_turns``: calls until the gateway refuses (then raises its error, or stops when ``catch``),
    posting 0.25 for each turn."""
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": "Go."}]
    while True:
        try:
            text = client.chat.completions.create(model=task.model, messages=messages).choices[0].message.content
        except openai.BadRequestError as exc:
            if catch and exc.code == "max_turns_exceeded":
                return None
            raise
        client.post("/reward", body={"reward": 0.25, "turn": -1}, cast_to=object)
        messages += [{"role": "assistant", "content": text or ""}, {"role": "user", "content": "Again."}]


def wrapped_error(task: AgentTask) -> AgentResult:
    """Fails the way agent frameworks do: the API's error wrapped in the framework's own, its message on a second
    line (smolagents: ``AgentGenerationError: Error while generating output:\\n<the 400>``)."""
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    try:
        client.chat.completions.create(
            model=task.model, messages=[{"role": "user", "content": "Go."}], tools=TOOLS, tool_choice="required"
        )
    except openai.BadRequestError as exc:
        raise RuntimeError(f"Error while generating output:\n{exc}") from exc
    return AgentResult(0.0)


def tool_caller(task: AgentTask) -> float:
    """Two calls offering the add tool; the tiny model's replies are whatever they are (the tests script them)."""
    play(task.base_url, task.api_key, task.seed, turns=2)
    return 0.0
