"""An agent harness that knows nothing of roll: it imports only ``openai`` (and the standard library).

It asks for a sum, offers an ``add`` tool, runs the tool calls the model makes and asks again when it makes none;
it returns what it saw, so tests can compare the gateway's records with the API's answers. Run as a program (the
external-runner test), it reads ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``ROLL_SEED`` and prints its reward.
"""

from __future__ import annotations

import json
import os

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def first_messages(seed: int) -> list[dict]:
    return [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": f"What is {seed} plus 7?"}]


def play(base_url: str, api_key: str, seed: int, turns: int = 3, **create: object) -> list[dict]:
    """``turns`` model calls; returns per call the messages sent, the reply message and the finish reason."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    messages = first_messages(seed)
    log = []
    for _ in range(turns):
        response = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, **create)
        reply = response.choices[0].message.model_dump(exclude_none=True)
        log.append(
            {
                "messages": [dict(m) for m in messages],
                "reply": reply,
                "finish_reason": response.choices[0].finish_reason,
            }
        )
        messages.append(reply)
        for call in reply.get("tool_calls", []):
            args = json.loads(call["function"]["arguments"])
            result = args.get("a", 0) + args.get("b", 0) if isinstance(args, dict) else "bad arguments"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})
        if not reply.get("tool_calls"):
            messages.append({"role": "user", "content": "Call the add tool."})
    return log


if __name__ == "__main__":
    calls = play(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], int(os.environ["ROLL_SEED"]), turns=2)
    print(f"{sum(bool(c['reply'].get('tool_calls')) for c in calls) + 0.5}")
