"""A Sokoban agent written against the OpenAI chat API: it knows nothing of roll's training.

It owns its game (roll's Sokoban env, seeded by the task), shows the board as a user message, sends the model's
reply to the game, posts each move's reward to the gateway (``POST /v1/reward``, per turn), and stops when the game
ends, after ``task.max_turns`` model calls, or when the conversation no longer fits (``context_length_exceeded``).
The messages are the ones roll's own env manager builds for ``sokoban_tiny`` (system prompt, then the board), so
the two runs train on the same prompts: docs/verified.md compares them.

Config: ``custom_envs.<tag>: {env_manager_cls: proxy, agent_runner_cls: examples.agents.sokoban_agent.play}``.
"""

from __future__ import annotations

import ssl

import httpx
import openai

from roll.agentic.gateway.runners import AgentResult, AgentTask
from roll.envs import make_env

#: One TLS context for every client of this process: each new ``openai.OpenAI`` otherwise builds one and loads the
#: CA bundle (about 20 ms of CPU), a quarter of the gateway's rollout at 128 episodes a step on a GPU. A client per
#: episode, not one shared pool: 128 threads on one httpx pool were slower still.
TLS = ssl.create_default_context()


def play(task: AgentTask, system_prompt: str = "You are a Sokoban player.") -> AgentResult:
    """One episode; the rewards go to the gateway turn by turn, the outcome is returned."""
    env = make_env("sokoban", {"format_penalty": task.format_penalty, **task.env.env_config})
    board, _ = env.reset(seed=task.seed)
    client = openai.OpenAI(
        base_url=task.base_url,
        api_key=task.api_key,
        max_retries=0,
        timeout=task.timeout_s or None,
        http_client=httpx.Client(verify=TLS),
    )
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": board}]
    success, metrics = False, {}
    for _ in range(task.max_turns):
        try:
            reply = client.chat.completions.create(model=task.model, messages=messages)
        except openai.BadRequestError as exc:
            if getattr(exc, "code", None) == "context_length_exceeded":
                break
            raise
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        board, reward, terminated, truncated, info = env.step(text)
        client.post("/reward", body={"reward": reward, "turn": -1}, cast_to=object)
        success, metrics = bool(info["success"]), dict(info["metrics"])
        if terminated or truncated:
            break
        messages.append({"role": "user", "content": board})
    return AgentResult(reward=0.0, success=success, metrics=metrics)  # 0.0: the per-turn rewards are the score
