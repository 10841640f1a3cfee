"""Normalization of per-sample scores (episode or response rewards) before advantages are computed.

Standard deviations here are sample (unbiased, ``n - 1``) standard deviations, as ``torch.std`` and the GRPO code of
verl and ROLL use; a group of one has no spread and counts as std 0. A group whose std is below
``STD_ZERO_TOL`` (1e-6) is treated as constant: standardizing it gives all zeros; RLVR's ``reward_scale`` alone
leaves it unchanged.

Agentic episodes: :func:`normalize_episode_scores` (``reward_normalization``: a mean and a std each from the batch or
the sample's group, :func:`scoped_norm`; ``method`` derives them when unset, as ROLL's). RLVR responses:
:func:`postprocess_rlvr_rewards` (``reward_norm`` scope, ``reward_shift`` / ``reward_scale``).
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


#: Where a mean or a standard deviation comes from: the whole batch, or each sample's group (ROLL's
#: ``norm_mean_type`` / ``norm_std_type``); None = no mean subtracted / no division.
NORM_SCOPES: tuple[str, ...] = ("batch", "group")

#: Capabilities: ``norm_types`` = (subtracts a mean, divides by a std), what ROLL derives ``norm_mean_type`` /
#: ``norm_std_type`` from when they are unset (None: a method with a formula of its own, which the norm types cannot
#: replace); ``clamp`` = (low, high) applied after the normalization, or None.
SCORE_NORMS: Registry[ScoreNormFn] = Registry(
    "score normalization method", "register_score_norm", {"norm_types": None, "clamp": None}
)
register_score_norm = SCORE_NORMS.register


def _standardize(scores: Tensor, group_ids: Tensor | None, shift: bool, scale: bool) -> Tensor:
    """RLVR's ``(s - mean_g) / (std_g + 1e-6)`` with shift/scale switchable; constant groups: 0 if shifted, else s."""
    stats = group_stats(scores, group_ids, unbiased=True)
    out = scores - stats.mean if shift else scores
    if scale:
        constant = stats.std < STD_ZERO_TOL
        out = torch.where(constant, out, out / (stats.std + NORM_EPS))
        if shift:
            out = torch.where(constant, torch.zeros_like(out), out)
    return out


def scoped_norm(scores: Tensor, group_ids: Tensor | None, mean: str | None, std: str | None) -> Tensor:
    """Normalize scores with a mean and a standard deviation each taken from the batch or from the sample's group,
    chosen independently (ROLL's ``agentic_reward_norm``).

    Formula, for sample i of group g (``group_ids``; None = one group, the batch) with n_g members::

        m_i  = mean over the batch | mean over g | 0          (mean = "batch" | "group" | None)
        sd_i = std over the batch  | std over g               (std  = "batch" | "group"), sample std (n - 1)
        out_i = s_i - m_i                                       when std is None
              = (s_i - m_i) / (sd_i + 1e-6)                     when n_g > 1 and sd_i >= 1e-6
              = 0                                               otherwise

    Edge cases, as ROLL: whenever a std is used, a sample whose group has one member gets 0 (even with the batch's
    std: it has no peer to be compared with), and so does every sample when the std is ~0 (``STD_ZERO_TOL``); without
    a std a group of one gets ``s - m`` (0 for the group's own mean, ``s - mean_batch`` for the batch's).

    Args:
        scores: (B,) float scores.
        group_ids: (B,) integer group ids, or None for one group (the whole batch).
        mean: ``"batch"``, ``"group"`` or None.
        std: ``"batch"``, ``"group"`` or None.
    Returns:
        (B,) normalized scores.
    """
    for name, scope in (("mean", mean), ("std", std)):
        if scope is not None and scope not in NORM_SCOPES:
            raise ValueError(f"{name} scope {scope!r}: use one of {NORM_SCOPES} or None")
    if mean is None and std is None:
        return scores.clone()
    group = group_stats(scores, group_ids, unbiased=True)
    stats = {"group": group, "batch": group_stats(scores, None, unbiased=True) if "batch" in (mean, std) else group}
    out = scores - stats[mean].mean if mean is not None else scores.clone()
    if std is None:
        return out
    sd = stats[std].std
    flat = (sd < STD_ZERO_TOL) | (group.count < 2)  # (B,): no spread, or no peer in the group
    return torch.where(flat, torch.zeros_like(out), out / (sd + NORM_EPS))


@register_score_norm("identity", norm_types=(False, False))
def identity_norm(scores: Tensor, group_ids: Tensor | None) -> Tensor:
    """``s`` unchanged. Shapes: (B,) -> (B,)."""
    return scores.clone()


@register_score_norm("mean", norm_types=(True, False))
def mean_norm(scores: Tensor, group_ids: Tensor | None) -> Tensor:
    """``s_i - mean_g``: subtract the group mean (a group of one gives 0). Shapes: (B,) -> (B,)."""
    return scoped_norm(scores, group_ids, "group", None)


@register_score_norm("mean_std", norm_types=(True, True))
def mean_std_norm(scores: Tensor, group_ids: Tensor | None) -> Tensor:
    """``(s_i - mean_g) / (std_g + 1e-6)``, sample std; 0 for a group of one or with std ~ 0. (B,) -> (B,)."""
    return scoped_norm(scores, group_ids, "group", "group")


@register_score_norm("asym_clip", norm_types=(True, True), clamp=(ASYM_CLIP_LOW, ASYM_CLIP_HIGH))
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


def resolve_norm_types(
    method: str, norm_mean_type: str | None, norm_std_type: str | None, whole_batch: bool
) -> tuple[str | None, str | None] | None:
    """The (mean, std) scopes of an episode normalization, as ROLL resolves ``reward_normalization``: a type that is
    set is used as is; a type left None is derived from ``method`` (its ``norm_types`` capability: ``identity`` ->
    neither, ``mean`` -> a mean, ``mean_std`` and ``asym_clip`` -> both) over the grouping's scope (``"batch"`` when
    the grouping is the whole batch, else ``"group"``). Returns None for a method with a formula of its own (a user's
    registered method) when no type is set.

    Raises:
        ValueError: a type is set together with a method that has a formula of its own.
    """
    derives = SCORE_NORMS.capabilities(method)["norm_types"]
    if derives is None:
        if norm_mean_type is not None or norm_std_type is not None:
            raise ValueError(
                f"method {method!r} has a formula of its own and cannot be combined with norm_mean_type="
                f"{norm_mean_type!r} / norm_std_type={norm_std_type!r}; unset them, or use a built-in method"
            )
        return None
    scope = "batch" if whole_batch else "group"
    mean = norm_mean_type if norm_mean_type is not None else (scope if derives[0] else None)
    std = norm_std_type if norm_std_type is not None else (scope if derives[1] else None)
    return mean, std


def normalize_episode_scores(
    scores: Tensor,
    group_ids: Tensor | None,
    method: str,
    norm_mean_type: str | None = None,
    norm_std_type: str | None = None,
) -> Tensor:
    """The agentic ``reward_normalization``: :func:`scoped_norm` with the scopes :func:`resolve_norm_types` gives,
    then the method's ``clamp`` (``asym_clip``: [-1, 3]); a method with a formula of its own runs that instead.

    Args:
        scores: (B,) episode scores.
        group_ids: (B,) the grouping's group ids, or None for ``grouping: batch``.
        method: a name of :data:`SCORE_NORMS`.
        norm_mean_type, norm_std_type: ``"batch"``, ``"group"`` or None (derived from ``method``).
    Returns:
        (B,) normalized scores.
    """
    types = resolve_norm_types(method, norm_mean_type, norm_std_type, whole_batch=group_ids is None)
    if types is None:
        return SCORE_NORMS.get(method)(scores, group_ids)
    out = scoped_norm(scores, group_ids, *types)
    clamp = SCORE_NORMS.capabilities(method)["clamp"]
    return out if clamp is None else out.clamp(*clamp)


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
