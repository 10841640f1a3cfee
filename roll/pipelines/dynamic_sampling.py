"""Which prompt groups make up an RLVR step: an epoch-shuffled prompt stream, group filters, refilling rounds.

A *group* is the ``num_return_sequences_in_group`` responses of one prompt with their rewards. With dynamic
sampling on, a group whose rewards are all equal (no GRPO signal) or whose mean / std fall outside the configured
bounds is dropped, and more prompts are drawn (at most ``max_additional_running_prompts`` beyond
``rollout_batch_size`` per step) until the batch holds ``rollout_batch_size`` kept groups.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from roll.config.rlvr import DynamicSamplingConfig

#: Rewards closer than this count as equal (a group with std below it has no learning signal).
EQUAL_TOL = 1e-6
FILTER_REASONS = ("all_equal", "std_low", "mean_low", "mean_high")


class PromptSampler:
    """An endless stream of dataset indices: each epoch is a fresh permutation of ``range(n)``.

    Epoch ``e`` is ``random.Random(seed * 1_000_003 + e).shuffle(range(n))``, so the stream is reproducible and
    resumable from ``(epoch, position)``.
    """

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError(f"PromptSampler needs at least one prompt, got n={n}")
        self.n, self.seed, self.epoch, self.position = n, seed, 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def draw(self, k: int) -> list[int]:
        """The next ``k`` indices (crossing epoch boundaries as needed)."""
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            take = min(k - len(out), self.n - self.position)
            out += self._order[self.position : self.position + take]
            self.position += take
        return out

    def state_dict(self) -> dict[str, int]:
        """Position in the stream, for checkpoints."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the stream from :meth:`state_dict`."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


def group_stats(scores: Sequence[float]) -> tuple[float, float]:
    """``(mean, population std)`` of one group's rewards."""
    mean = sum(scores) / len(scores)
    return mean, math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))


def filter_reason(scores: Sequence[float], cfg: DynamicSamplingConfig) -> str | None:
    """Why a group with rewards ``scores`` is dropped (one of :data:`FILTER_REASONS`), or None to keep it.

    Checked in order: all equal (``max - min < 1e-6``, if ``drop_all_equal``), ``std < std_min``,
    ``mean < mean_low``, ``mean > mean_high``; std is the population std.
    """
    if not scores:
        raise ValueError("filter_reason: a group needs at least one reward")
    mean, std = group_stats(scores)
    if cfg.drop_all_equal and max(scores) - min(scores) < EQUAL_TOL:
        return "all_equal"
    if cfg.std_min is not None and std < cfg.std_min:
        return "std_low"
    if cfg.mean_low is not None and mean < cfg.mean_low:
        return "mean_low"
    if cfg.mean_high is not None and mean > cfg.mean_high:
        return "mean_high"
    return None


class ScoredGroup(Protocol):
    """What the filters need of a group: its responses' rewards."""

    scores: list[float]


G = TypeVar("G", bound=ScoredGroup)


def collect_groups(
    need: int,
    run_round: Callable[[int], list[G]],
    cfg: DynamicSamplingConfig,
    use_additional: bool,
    max_additional: int,
) -> tuple[list[G], dict[str, float]]:
    """Collect ``need`` groups for one step, filtering and refilling when ``cfg.enabled``.

    Args:
        need: groups the batch must hold (``rollout_batch_size``).
        run_round: ``k -> k`` scored groups for the next ``k`` prompts (generation + rewards).
        cfg: the filters.
        use_additional: draw more prompts when groups are dropped (``is_use_additional_prompts``).
        max_additional: at most this many prompts beyond ``need`` per step.

    Rounds: first ``need`` prompts; then, while groups are missing and budget is left,
    ``min(budget_left, ceil(missing / keep_rate))`` prompts (all the budget left if nothing was kept yet).
    Surplus kept groups are discarded. Still short when the budget is spent: the dropped groups with the highest
    std fill the gap, so the batch size (and the train mini-batch layout) stays fixed; the count is reported as
    ``dynamic_sampling/filled_with_filtered``.

    Returns:
        ``(groups, metrics)``: groups in draw order; ``dynamic_sampling/*`` metrics (empty when disabled).
    """
    if not cfg.enabled:
        return run_round(need), {}
    budget = need + (max_additional if use_additional else 0)
    kept: list[G] = []
    dropped: list[tuple[str, G]] = []
    drawn, rounds, ask = 0, 0, need
    while True:
        for group in run_round(ask):
            reason = filter_reason(group.scores, cfg)
            if reason is None:
                kept.append(group)
            else:
                dropped.append((reason, group))
        drawn, rounds = drawn + ask, rounds + 1
        missing = need - len(kept)
        if missing <= 0 or drawn >= budget:
            break
        ask = budget - drawn if not kept else min(budget - drawn, math.ceil(missing * drawn / len(kept)))
    passed = len(kept)
    kept = kept[:need]
    spare = sorted((g for _, g in dropped), key=lambda g: -group_stats(g.scores)[1])  # stable: draw order on ties
    filled = max(0, min(need - len(kept), len(spare)))
    kept += spare[:filled]
    metrics = {
        "dynamic_sampling/rounds": float(rounds),
        "dynamic_sampling/prompts_drawn": float(drawn),
        "dynamic_sampling/additional_prompts": float(drawn - need),
        "dynamic_sampling/groups_filtered": float(len(dropped)),
        "dynamic_sampling/kept_ratio": passed / drawn,
        "dynamic_sampling/surplus_discarded": float(max(0, passed - need)),
        "dynamic_sampling/filled_with_filtered": float(filled),
        "dynamic_sampling/batch_groups": float(len(kept)),
    }
    for reason in FILTER_REASONS:
        metrics[f"dynamic_sampling/filtered_{reason}"] = float(sum(r == reason for r, _ in dropped))
    return kept, metrics
