"""A Sokoban agent that shows the model pictures, written against the OpenAI chat API: it knows nothing of roll's
training.

It owns its game (roll's Sokoban env in ``render_mode="rgb_array"``, seeded by the task), sends each frame as an
``image_url`` content part (a PNG data URL) with a short text, sends the model's reply to the game, posts each
move's reward to the gateway (``POST /v1/reward``, per turn), and stops when the game ends, after
``task.max_turns`` model calls, or when the conversation no longer fits (``context_length_exceeded``). The actor must
be a vision-language model (a text-only actor answers image parts with a 400).

Config: ``custom_envs.<tag>: {env_manager_cls: proxy, agent_runner_cls: examples.agents.sokoban_frames_agent.play}``
(``examples/config/sokoban_vl_agent_tiny.yaml``).
"""

from __future__ import annotations

import openai

from roll.agentic.gateway.images import image_url_part
from roll.agentic.gateway.runners import AgentResult, AgentTask
from roll.envs import make_env


def play(task: AgentTask, system_prompt: str = "You are a Sokoban player.", text: str = "Move.") -> AgentResult:
    """One episode; the rewards go to the gateway turn by turn, the outcome is returned."""
    env = make_env(
        "sokoban", {"format_penalty": task.format_penalty, **task.env.env_config, "render_mode": "rgb_array"}
    )
    observation, _ = env.reset(seed=task.seed)
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0, timeout=task.timeout_s or None)
    messages: list = [{"role": "system", "content": system_prompt}]
    success, metrics = False, {}
    for _ in range(task.max_turns):
        parts = [image_url_part(frame) for frame in observation.images]
        messages.append({"role": "user", "content": [*parts, {"type": "text", "text": text}]})
        try:
            reply = client.chat.completions.create(model=task.model, messages=messages)
        except openai.BadRequestError as exc:
            if getattr(exc, "code", None) == "context_length_exceeded":
                break
            raise
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        observation, reward, terminated, truncated, info = env.step(answer)
        client.post("/reward", body={"reward": reward, "turn": -1}, cast_to=object)
        success, metrics = bool(info["success"]), dict(info["metrics"])
        if terminated or truncated:
            break
    return AgentResult(reward=0.0, success=success, metrics=metrics)  # 0.0: the per-turn rewards are the score
