"""roll.rewards: rule rewards (math answer checking) and the workers that apply them to batches."""

from roll.rewards.math_answer import answers_match, extract_answer, math_reward, normalize_answer
from roll.rewards.registry import RewardResult, get_reward_fn, register_reward, registered_rewards

__all__ = [
    "RewardResult",
    "answers_match",
    "extract_answer",
    "get_reward_fn",
    "math_reward",
    "normalize_answer",
    "register_reward",
    "registered_rewards",
]
