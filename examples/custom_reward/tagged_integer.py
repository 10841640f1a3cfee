"""A user reward for the RLVR pipeline (docs/rlvr.md, "Writing a reward"): full score for the right integer in
``<answer>...</answer>``, a small bonus for a well-formed wrong one.

Importing this module registers it; a config names it as ``examples.custom_reward.tagged_integer:tagged_integer``
(in ``rewards.tag_to_reward``), so the driver and every Ray reward worker import it first.
"""

from __future__ import annotations

import re

from roll.rewards import RewardResult, register_reward

ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


@register_reward("tagged_integer")
def tagged_integer(response: str, ground_truth: str, *, format_bonus: float = 0.1) -> RewardResult:
    """1.0 for ``<answer>N</answer>`` with N equal to the ground truth; ``format_bonus`` for a tagged wrong integer;
    0.0 without a tagged integer. The score must be a finite float (NaN or infinity stops the run)."""
    match = ANSWER.search(response)
    if match is None:
        return RewardResult(score=0.0, correct=False, extracted=None, format_ok=False)
    correct = int(match.group(1)) == int(ground_truth)
    return RewardResult(
        score=1.0 if correct else format_bonus, correct=correct, extracted=match.group(1), format_ok=True
    )
