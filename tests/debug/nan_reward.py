"""User rewards with numeric bugs, registered at import (``tag_to_reward`` names them as ``module:name``):
``debug_nan_reward`` scores every response NaN; ``debug_huge_reward`` gives 3e38 (finite, but the gradients of a
loss scaled by it overflow)."""

from __future__ import annotations

from roll.rewards.registry import RewardResult, register_reward, registered_rewards


def nan_reward(response: str, ground_truth: str, **options: float) -> RewardResult:
    """NaN for every response: the bug a ``0 / 0`` in float arithmetic makes."""
    return RewardResult(float("nan"), False, None, False)


def huge_reward(response: str, ground_truth: str, **options: float) -> RewardResult:
    """3e38 for every response: finite, but a loss scaled by it has infinite gradients."""
    return RewardResult(3e38, False, None, False)


for _name, _fn in (("debug_nan_reward", nan_reward), ("debug_huge_reward", huge_reward)):
    if _name not in registered_rewards():
        register_reward(_name)(_fn)
