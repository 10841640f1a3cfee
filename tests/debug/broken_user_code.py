"""Deliberately broken user code for the debugging tests: an env whose ``step`` raises on every other instance,
and a reward function that raises on the response ``"boom"``. Lines marked ``# RAISES`` are asserted on.

Nothing is registered at import (test collection would otherwise put a raising env into every session's
registry, e.g. into the tiny tokenizer's corpus): tests call :func:`register` / :func:`unregister`; Ray actors
import ``tests.debug.broken_env_plugin`` through ``env_type`` (:data:`ENV_TYPE`), which registers here.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from roll.envs import registry as env_registry
from roll.envs.registry import register_env
from roll.envs.sokoban.env import SokobanEnv
from roll.rewards import registry as reward_registry
from roll.rewards.registry import RewardResult, register_reward

ENV_NAME = "debug_broken_sokoban"
ENV_TYPE = f"tests.debug.broken_env_plugin:{ENV_NAME}"
REWARD_NAME = "debug_broken_reward"
_instances = itertools.count()


def raising_lines() -> list[int]:
    """Line numbers (1-based) of this file's ``# RAISES`` lines: [env line, reward line]."""
    lines = Path(__file__).read_text().splitlines()
    return [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith("# RAISES")]


class BrokenSokoban(SokobanEnv):
    """Sokoban whose even-numbered instances raise in ``step`` (a user bug in an env)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.broken = next(_instances) % 2 == 0

    def step(self, action):
        if self.broken:
            raise RuntimeError("deliberate bug in BrokenSokoban.step")  # RAISES
        return super().step(action)


def broken_reward(response: str, ground_truth: str, **options: float) -> RewardResult:
    """1.0 when ``response == ground_truth``; a user bug on the response ``"boom"``."""
    if response == "boom":
        return RewardResult(float(len(response) / 0), False, None, False)  # RAISES
    return RewardResult(float(response == ground_truth), response == ground_truth, response, True)


def register() -> None:
    """Register the broken env and reward (idempotent)."""
    if ENV_NAME not in env_registry.list_envs():
        register_env(ENV_NAME, BrokenSokoban)
    if REWARD_NAME not in reward_registry.registered_rewards():
        register_reward(REWARD_NAME)(broken_reward)


def unregister() -> None:
    """Remove them again, so later tests see the registries as they were."""
    env_registry.unregister_env(ENV_NAME)
    reward_registry.REWARDS.unregister(REWARD_NAME)
