"""Reward-function registry: one name per rule reward, filled by ``@register_reward``.

Every entry shares the :class:`RewardFn` signature, so callers (the reward workers) never branch on names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from roll.registry import Registry


@dataclass(frozen=True)
class RewardResult:
    """The outcome of scoring one response.

    Attributes:
        score: the scalar reward given to the response.
        correct: whether the extracted answer matches the ground truth.
        extracted: the answer found in the response, or ``None`` when none was found.
        format_ok: whether the answer was given in an explicit answer format (``\\boxed{}``, ``####``,
            ``<answer>``) rather than recovered from the last number in the text.
    """

    score: float
    correct: bool
    extracted: str | None
    format_ok: bool


class RewardFn(Protocol):
    """Signature shared by every registered reward: ``fn(response, ground_truth, **options) -> RewardResult``."""

    def __call__(self, response: str, ground_truth: str, **options: float) -> RewardResult:
        """Score ``response`` against ``ground_truth``."""
        ...


#: ``needs_ground_truth``: the reward compares the response with the row's ground truth (rule rewards); one that
#: scores the response alone declares False, so data without a ground-truth column can use it.
REWARDS: Registry[RewardFn] = Registry("reward", "register_reward", capabilities={"needs_ground_truth": True})


def register_reward(name: str, **capabilities: bool) -> Callable[[RewardFn], RewardFn]:
    """Register a reward function under ``name`` (a tag or domain such as ``"math"``), declaring ``capabilities``.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    return REWARDS.register(name, **capabilities)


def get_reward_fn(name: str) -> RewardFn:
    """Return the reward function registered as ``name`` (or ``"package.module:name"``, importing it first).

    Raises:
        KeyError: naming the unknown reward and listing the registered ones.
    """
    return REWARDS.get(name)


def registered_rewards() -> list[str]:
    """Names of all registered reward functions, sorted."""
    return REWARDS.names()


def reward_option_names(name: str) -> list[str] | None:
    """The keyword options reward ``name`` accepts (None: any, it takes ``**options``)."""
    params = inspect.signature(get_reward_fn(name)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [
        p.name
        for p in params
        if p.kind is p.KEYWORD_ONLY
        or (p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("response", "ground_truth"))
    ]
