"""A shopping-bill agent built with the OpenAI Agents SDK (``openai-agents``), trained through roll's gateway.

The agent has one function tool, ``price(item)``, and is asked what ``count`` of an item cost. The harness configures
the SDK and nothing else: its chat-completions model class (``OpenAIChatCompletionsModel``; the gateway serves the
Chat Completions API, not the Responses API) on an ``AsyncOpenAI`` client pointed at the gateway, tracing off (the SDK
would otherwise export traces to OpenAI's servers), and ``max_turns`` from the task. docs/agents_openai_agents.md
walks through it; its config is ``examples/config/openai_agents_tiny.yaml``.
"""

from __future__ import annotations

import asyncio
import re

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from roll.agentic.gateway.runners import AgentResult, AgentTask

set_tracing_disabled(True)  # no trace export: nothing leaves the machine

PRICES = {"apple": 3, "bread": 5, "cheese": 9, "milk": 2, "tea": 4}


@function_tool
def price(item: str) -> str:
    """The price of one ``item`` in euros (apple, bread, cheese, milk or tea)."""
    return str(PRICES.get(item.strip().lower(), "unknown item"))


def shop(task: AgentTask, shaping: float = 0.5) -> AgentResult:
    """One episode. Reward: 1 when the final answer holds the right total, else up to ``shaping`` the closer its
    first number is (so that a model that cannot answer yet still learns; set 0 for a model that can)."""
    items = sorted(PRICES)
    item, count = items[task.seed % len(items)], 2 + task.seed % 3  # the episodes of a group share the seed
    total = PRICES[item] * count
    agent = Agent(
        name="shopper",
        instructions="Answer with the total price in euros. Use the price tool.",
        tools=[price],
        model=OpenAIChatCompletionsModel(
            model=task.model, openai_client=AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
        ),
    )
    try:  # a run of its own on this thread's event loop: episodes run on threads of the env manager
        result = asyncio.run(Runner.run(agent, f"What do {count} {item}s cost?", max_turns=task.max_turns))
        answer = str(result.final_output)
    except (MaxTurnsExceeded, ModelBehaviorError):  # out of turns, or a call of an unknown tool: no answer
        answer = ""
    numbers = [int(n) for n in re.findall(r"\d+", answer)]
    if numbers and numbers[0] == total:
        return AgentResult(1.0, success=True)
    closeness = max(0.0, 1.0 - abs(numbers[0] - total) / total) if numbers else 0.0
    return AgentResult(shaping * closeness, success=False, metrics={"answered": float(bool(numbers))})
