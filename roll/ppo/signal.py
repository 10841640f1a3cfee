"""The signal watch: a run with no learning signal for ``zero_signal_patience`` steps stops and says why."""

from __future__ import annotations

import sys
from typing import Any

from roll.data.batch import Batch
from roll.errors import RunStopped
from roll.ppo.loss_fns import loss_mask


# ---------------------------------------------------------------------------- score normalization
class NoLearningSignal(RunStopped):
    """``zero_signal_patience`` steps in a row had only zero advantages: the run stops (one line, the cause)."""


def zero_signal_groups(batch: Batch) -> tuple[int, int]:
    """``(groups whose advantages are all zero on response tokens, groups)`` by ``group_id``."""
    moved = (batch["advantages"] * loss_mask(batch)).abs().sum(-1) > 0  # (B,)
    alive: dict[Any, bool] = {}
    for gid, m in zip(batch["group_id"], moved.tolist()):
        alive[gid] = alive.get(gid, False) or m
    return sum(not a for a in alive.values()), len(alive)


def dead_signal_cause(batch: Batch) -> str:
    """The likely reason a step's advantages are all zero, from its scores and groups."""
    scores, groups = batch["scores"].float(), batch["group_id"]
    if len(set(groups)) == len(groups):
        return (
            "every group has one sample, and group-normalized advantages of a single sample are 0: use "
            "group_size / num_return_sequences_in_group >= 2"
        )
    if bool((scores == scores[0]).all()):
        return (
            f"every sample scored {float(scores[0]):g}: the policy solves all or none of the tasks (make them "
            f"easier or harder, or warm-start longer), or the reward function returns a constant"
        )
    return (
        "within each group every sample scored the same (groups solved all-or-none): more samples per group "
        "or more varied tasks give contrast"
    )


class SignalWatch:
    """Counts steps whose advantages are all zero: ``rollout/zero_signal_groups`` (and their share of the step's
    groups, ``rollout/zero_signal_frac``, which the run-health check reads) every step, a warning with the likely
    cause on the first dead step, and :class:`NoLearningSignal` after ``patience`` dead steps in a row (0 =
    never)."""

    def __init__(self, patience: int):
        self.patience, self.dead_in_row, self.warned = patience, 0, False

    def __call__(self, step: int, batch: Batch) -> dict[str, float]:
        zero, groups = zero_signal_groups(batch)
        metrics = {"rollout/zero_signal_groups": float(zero), "rollout/zero_signal_frac": zero / max(1, groups)}
        if zero < groups or not groups:
            self.dead_in_row = 0
            return metrics
        self.dead_in_row += 1
        cause = dead_signal_cause(batch)
        if not self.warned:
            self.warned = True
            print(
                f"[roll] warning: step {step}: every advantage is zero, so this step does not train the actor: "
                f"{cause} (the run stops after zero_signal_patience={self.patience} such steps in a row; 0 = "
                f"never)",
                file=sys.stderr,
                flush=True,
            )
        if self.patience and self.dead_in_row >= self.patience:
            raise NoLearningSignal(
                f"{self.dead_in_row} steps in a row (up to step {step}) had only zero "
                f"advantages, so nothing was trained: {cause}; zero_signal_patience="
                f"{self.patience} (0 = never stop)"
            )
        return metrics


# ---------------------------------------------------------------------------- the update
