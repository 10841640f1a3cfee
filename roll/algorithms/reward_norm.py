"""Normalization of per-sample scores (episode or response rewards) before advantages are computed.

Standard deviations here are sample (unbiased, ``n - 1``) standard deviations, as ``torch.std`` and the GRPO code of
verl and ROLL use; a group of one has no spread and counts as std 0. A group whose std is below
``STD_ZERO_TOL`` (1e-6) is treated as constant: standardizing it gives all zeros, scaling it leaves it unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from roll.algorithms.groups import STD_ZERO_TOL, group_stats
from roll.registry import Registry

NORM_EPS = 1e-6
ASYM_CLIP_LOW, ASYM_CLIP_HIGH = -1.0, 3.0


class ScoreNormFn(Protocol):
    """Signature of a score normalization method: ``(scores (B,), group_ids (B,) | None) -> (B,)``."""

    def __call__(self, scores: Tensor, group_ids: Tensor | None) -> Tensor: ...


SCORE_NORMS: Registry[ScoreNormFn] = Registry("score normalization method", "register_score_norm")
register_score_norm = SCORE_NORMS.register


def _standardize(scores: Tensor, group_ids: Tensor | None, shift: bool, scale: bool) -> Tensor:
    """``(s - mean_g) / (std_g + 1e-6)`` with shift/scale switchable; constant groups: 0 if shifted, else s."""
    stats = group_stats(scores, group_ids, unbiased=True)
    out = scores - stats.mean if shift else scores
    if scale:
        constant = stats.std < STD_ZERO_TOL
        out = torch.where(constant, out, out / (stats.std + NORM_EPS))
        if shift:
            out = torch.where(constant, torch.zeros_like(out), out)
    return out


@register_score_norm("identity")
def identity_norm(scores: Tensor, group_ids: Tensor | None) -> Tensor:
    """``s`` unchanged. Shapes: (B,) -> (B,)."""
    return scores.clone()


@register_score_norm("mean")
def mean_norm(scores: Tensor, group_ids: Tensor | None) -> Tensor:
    """``s_i - mean_g``: subtract the group mean (a group of one gives 0). Shapes: (B,) -> (B,)."""
    return _standardize(scores, group_ids, shift=True, scale=False)


@register_score_norm("mean_std")
def mean_std_norm(scores: Tensor, group_ids: Tensor | None) -> Tensor:
    """``(s_i - mean_g) / (std_g + 1e-6)``, sample std; 0 for a group of one or with std ~ 0. (B,) -> (B,)."""
    return _standardize(scores, group_ids, shift=True, scale=True)


@register_score_norm("asym_clip")
def asym_clip_norm(scores: Tensor, group_ids: Tensor | None) -> Tensor:
    """``clamp(mean_std(s), -1, 3)``: standardize, then clip losses harder than wins. (B,) -> (B,)."""
    return mean_std_norm(scores, group_ids).clamp(ASYM_CLIP_LOW, ASYM_CLIP_HIGH)


def normalize_scores(scores: Tensor, group_ids: Tensor | None, method: str) -> Tensor:
    """Normalize per-sample scores within groups.

    Args:
        scores: (B,) float scores.
        group_ids: (B,) integer group ids; ``None`` means one group (the whole batch). The caller maps the
            ``reward_normalization.grouping`` setting to ids: ``state`` -> same-seed group id, ``batch`` -> None,
            ``inductive`` -> env tag id.
        method: a registered name: ``identity``, ``mean``, ``mean_std`` or ``asym_clip`` (see their docstrings).
    Returns:
        (B,) normalized scores.
    """
    return SCORE_NORMS.get(method)(scores, group_ids)


class RunningMeanStd:
    """Running mean and population standard deviation of a stream of values (Chan et al. parallel update).

    Statistics are kept in float64. Before any update, ``mean`` is 0 and ``std`` is 1.
    """

    def __init__(self) -> None:
        self.count = 0
        self._mean = 0.0
        self._m2 = 0.0  # sum of squared deviations from the mean

    def update(self, x: Tensor) -> None:
        """Fold all elements of ``x`` (any shape) into the statistics."""
        x = x.detach().to(torch.float64).flatten()
        n = int(x.numel())
        if n == 0:
            return
        batch_mean = float(x.mean())
        batch_m2 = float(((x - batch_mean) ** 2).sum())
        total = self.count + n
        delta = batch_mean - self._mean
        self._mean += delta * n / total
        self._m2 += batch_m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def mean(self) -> float:
        """Mean of all values seen (0.0 before the first update)."""
        return self._mean

    @property
    def std(self) -> float:
        """Population standard deviation ``sqrt(M2 / count)`` of all values seen (1.0 before the first update)."""
        return math.sqrt(self._m2 / self.count) if self.count > 0 else 1.0

    def state_dict(self) -> dict[str, Any]:
        """Return a picklable snapshot for checkpoints."""
        return {"count": self.count, "mean": self._mean, "m2": self._m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output."""
        self.count = int(state["count"])
        self._mean = float(state["mean"])
        self._m2 = float(state["m2"])


class RewardNormScopeFn(Protocol):
    """Signature of an RLVR ``reward_norm`` scope: where the statistics come from.
    ``(scores (B,), group_ids (B,) | None, shift, scale, running) -> (B,)``."""

    def __call__(
        self, scores: Tensor, group_ids: Tensor | None, shift: bool, scale: bool, running: RunningMeanStd | None
    ) -> Tensor: ...


REWARD_NORM_SCOPES: Registry[RewardNormScopeFn] = Registry("reward_norm scope", "register_reward_norm_scope")
register_reward_norm_scope = REWARD_NORM_SCOPES.register
RlvrRewardNorm = Literal["batch", "group", "running"]


@register_reward_norm_scope("batch")
def batch_scope(
    scores: Tensor, group_ids: Tensor | None, shift: bool, scale: bool, running: RunningMeanStd | None
) -> Tensor:
    """Statistics of the whole batch. (B,) -> (B,)."""
    return _standardize(scores, None, shift, scale)


@register_reward_norm_scope("group")
def group_scope(
    scores: Tensor, group_ids: Tensor | None, shift: bool, scale: bool, running: RunningMeanStd | None
) -> Tensor:
    """Statistics of each prompt's responses (``group_ids``). (B,) -> (B,)."""
    if group_ids is None:
        raise ValueError("reward_norm='group' needs group_ids (one prompt id per response); pass them")
    return _standardize(scores, group_ids, shift, scale)


@register_reward_norm_scope("running")
def _running_norm(
    scores: Tensor, group_ids: Tensor | None, shift: bool, scale: bool, running: RunningMeanStd | None
) -> Tensor:
    """Update ``running`` with ``scores`` then shift/scale by its statistics. (B,) -> (B,)."""
    if running is None:
        raise ValueError("reward_norm='running' needs a RunningMeanStd; pass running=RunningMeanStd() and keep it")
    running.update(scores)
    out = scores - running.mean if shift else scores
    if scale and running.std >= STD_ZERO_TOL:
        out = out / (running.std + NORM_EPS)
    elif scale and shift:
        out = torch.zeros_like(out)
    return out


def postprocess_rlvr_rewards(
    scores: Tensor,
    group_ids: Tensor | None,
    *,
    reward_norm: RlvrRewardNorm | None,
    reward_shift: bool,
    reward_scale: bool,
    reward_clip: float | None,
    running: RunningMeanStd | None = None,
) -> Tensor:
    """Normalize and clip RLVR response rewards.

    Statistics come from the scope that ``reward_norm`` names (:data:`REWARD_NORM_SCOPES`): ``batch`` (all B),
    ``group`` (the responses sharing a ``group_ids`` value, i.e. one prompt's ``num_return_sequences_in_group``
    samples) or ``running`` (``running`` is updated with this batch first, then its mean/std are used); ``None``
    skips normalization.
    Within the scope: ``reward_shift`` only -> ``s - mean``; ``reward_scale`` only -> ``s / (std + 1e-6)``;
    both or neither -> ``(s - mean) / (std + 1e-6)``. Then ``reward_clip`` c clamps to ``[-c, c]``.

    Args:
        scores: (B,) response-level rewards.
        group_ids: (B,) prompt ids; required for ``reward_norm='group'``.
        reward_norm: ``"batch"``, ``"group"``, ``"running"`` or None.
        reward_shift: subtract the mean only.
        reward_scale: divide by the std only.
        reward_clip: positive clip bound, or None.
        running: running statistics, required for ``reward_norm='running'``.
    Returns:
        (B,) processed rewards.
    """
    if reward_norm is None and (reward_shift or reward_scale):
        raise ValueError(
            f"reward_shift={reward_shift} / reward_scale={reward_scale} need a scope; set reward_norm to "
            "'batch', 'group' or 'running', or turn both off"
        )
    shift, scale = (reward_shift, reward_scale) if (reward_shift or reward_scale) else (True, True)
    if reward_norm is None:
        out = scores.clone()
    else:
        try:
            scope = REWARD_NORM_SCOPES.get(reward_norm)  # a name, or "package.module:name" of a user scope
        except KeyError:
            valid = ", ".join(repr(n) for n in REWARD_NORM_SCOPES.names())
            raise ValueError(f"unknown reward_norm {reward_norm!r}; valid: {valid} or None") from None
        out = scope(scores, group_ids, shift, scale, running)
    if reward_clip is not None:
        if reward_clip <= 0:
            raise ValueError(f"reward_clip must be positive or None, got {reward_clip}; e.g. reward_clip=10.0")
        out = out.clamp(-reward_clip, reward_clip)
    return out
