"""A letter-counting agent built with smolagents (``smolagents``), trained through roll's gateway.

The agent is smolagents' ``ToolCallingAgent`` with its default prompts and one tool, ``letters(word)``, asked how
many letters two words have together. The harness configures smolagents and nothing else: ``OpenAIModel`` (the class
once named ``OpenAIServerModel``) pointed at the gateway, with ``tool_choice="auto"``: smolagents sends
``tool_choice="required"`` by default, a forced call that the gateway refuses (docs/agents.md says why), and
``max_steps`` from the task's turn budget. smolagents makes one more model call than ``max_steps`` to ask for a
final answer; past the budget the gateway refuses it, smolagents takes the refusal as its final answer, and the
episode counts as cut by the turn limit. ``stream`` (``agent_runner_kwargs``) streams the model's replies
(``stream_outputs``). docs/agents_smolagents.md walks through it; its config is
``examples/config/smolagents_tiny.yaml``.
"""

from __future__ import annotations

import re

from smolagents import OpenAIModel, ToolCallingAgent, tool

from roll.agentic.gateway.runners import AgentResult, AgentTask

WORDS = ["apple", "kiwi", "banana", "fig", "cherry", "plum", "mango", "pear"]


@tool
def letters(word: str) -> int:
    """Count the letters of a word.

    Args:
        word: the word whose letters are counted.
    """
    return len(word.strip())


def count(task: AgentTask, shaping: float = 0.5, stream: bool = False) -> AgentResult:
    """One episode. Reward: 1 when the final answer holds the right total, else up to ``shaping`` the closer the
    first number of its answer (or, without one, of its replies) came (so that a model that cannot count yet still
    learns; set 0 for a model that can)."""
    first, second = WORDS[task.seed % len(WORDS)], WORDS[(task.seed // len(WORDS)) % len(WORDS)]
    total = len(first) + len(second)  # the episodes of a group share the seed: the same words
    model = OpenAIModel(
        model_id=task.model,
        api_base=task.base_url,
        api_key=task.api_key,
        client_kwargs={"max_retries": 0},
        tool_choice="auto",  # smolagents' default, "required", forces a call: refused by the gateway
    )
    agent = ToolCallingAgent(
        tools=[letters], model=model, max_steps=task.max_turns, verbosity_level=-1, stream_outputs=stream
    )  # verbosity -1: smolagents prints nothing (episodes run by the dozen in the env manager's process)
    run = agent.run(f"How many letters do the words {first} and {second} have together?", return_full_result=True)
    answer = str(run.output) if run.state == "success" else ""  # out of steps: the "answer" is an error text
    replies = [str(getattr(step, "model_output", None) or "") for step in agent.memory.steps]
    numbers = [int(n) for text in [answer, *replies] for n in re.findall(r"\d+", text)]
    if answer and re.findall(r"\d+", answer)[:1] == [str(total)]:
        return AgentResult(1.0, success=True)
    closeness = max(0.0, 1.0 - abs(numbers[0] - total) / total) if numbers else 0.0
    return AgentResult(shaping * closeness, success=False, metrics={"answered": float(bool(answer))})
