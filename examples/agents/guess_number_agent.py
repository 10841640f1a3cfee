"""Guess the hidden number: an agent harness written against the OpenAI chat API, trained through roll's gateway.

It knows nothing of roll's training: it offers a ``guess`` tool, answers each guess with "higher", "lower" or
"correct", and returns the episode's reward. docs/agents.md shows it whole; its config is
``examples/config/guess_number_agent_tiny.yaml``.
"""

from __future__ import annotations

import json
import re

import openai

from roll.agentic.gateway.runners import AgentResult, AgentTask

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess the hidden number; the answer is higher, lower or correct.",
            "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]},
        },
    }
]


def play(task: AgentTask, max_number: int = 16) -> AgentResult:
    """One episode of at most ``task.max_turns`` model calls. Reward: 1 for finding the number, else up to 0.5 the
    closer the best guess came (so that a model that cannot find it yet still learns from its guesses)."""
    secret = 1 + task.seed % max_number  # the episodes of a group share the seed: the same hidden number
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": f"Find the hidden number from 1 to {max_number} with the guess tool."}]
    guesses: list[int] = []
    for _ in range(task.max_turns):
        message = client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:  # a number the model passed to the tool
            number = json.loads(call.function.arguments or "{}").get("number")
            guesses += [number] if isinstance(number, int) else []
            answer = "correct" if number == secret else "higher" if (number or 0) < secret else "lower"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
        if not message.tool_calls:  # a number written in plain text counts too
            guesses += [int(n) for n in re.findall(r"\d+", message.content or "")[:1]]
            messages.append({"role": "user", "content": "Use the guess tool."})
        if secret in guesses:
            break
    best = min((abs(g - secret) for g in guesses), default=max_number)
    reward = 1.0 if best == 0 else 0.5 * max(0.0, 1.0 - best / max_number)
    return AgentResult(reward, success=best == 0, metrics={"guesses": float(len(guesses))})
