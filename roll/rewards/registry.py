"""Reward-function registry: one name per rule reward, filled by ``@register_reward``.

Every entry shares the :class:`RewardFn` signature, so callers (the reward workers) never branch on names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


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


_REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register a reward function under ``name`` (a tag or domain such as ``"math"``).

    Raises:
        ValueError: if ``name`` is already registered.
    """

    def decorator(fn: RewardFn) -> RewardFn:
        if name in _REWARDS:
            raise ValueError(
                f"reward {name!r} is already registered (by {_REWARDS[name]!r}); pick another name"
            )
        _REWARDS[name] = fn
        return fn

    return decorator


def get_reward_fn(name: str) -> RewardFn:
    """Return the reward function registered as ``name``.

    Raises:
        KeyError: naming the unknown reward and listing the registered ones.
    """
    if name not in _REWARDS:
        raise KeyError(
            f"unknown reward {name!r}; registered rewards: {sorted(_REWARDS)}. "
            "Register one with @register_reward(name) or fix the tag."
        )
    return _REWARDS[name]


def registered_rewards() -> list[str]:
    """Names of all registered reward functions, sorted."""
    return sorted(_REWARDS)
