"""Per-group statistics of per-sample scores, vectorized with ``index_add``.

A batch of B samples is split into groups by an integer id per sample (e.g. the rollouts of one prompt or of
one environment seed). Ids are arbitrary integers; they are mapped to ``0..G-1`` first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# A group whose standard deviation is below this is treated as constant (all members equal).
STD_ZERO_TOL = 1e-6


@dataclass(frozen=True)
class GroupStats:
    """Statistics of each sample's group, broadcast back to the samples.

    Attributes:
        mean: (B,) mean score of the sample's group.
        std: (B,) standard deviation of the sample's group (0 for a group of one).
        count: (B,) number of samples in the sample's group.
    """

    mean: Tensor
    std: Tensor
    count: Tensor


def group_index(group_ids: Tensor | None, batch_size: int, device: torch.device | None = None) -> tuple[Tensor, int]:
    """Map arbitrary group ids to dense indices ``0..G-1``.

    Args:
        group_ids: (B,) integer tensor, or ``None`` for one group holding the whole batch.
        batch_size: B, used when ``group_ids`` is None and to check its shape.
        device: device of the result when ``group_ids`` is None.
    Returns:
        ``(index (B,) long, G)``.
    """
    if group_ids is None:
        return torch.zeros(batch_size, dtype=torch.long, device=device), 1
    if group_ids.dim() != 1 or group_ids.shape[0] != batch_size:
        raise ValueError(
            f"group_ids must have shape ({batch_size},) (one id per sample), got {tuple(group_ids.shape)}; "
            "pass one integer group id per sample, or None for a single group"
        )
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise TypeError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}; use .long()")
    uniq, index = torch.unique(group_ids, return_inverse=True)
    return index, int(uniq.numel())


def group_stats(scores: Tensor, group_ids: Tensor | None, unbiased: bool = True) -> GroupStats:
    """Mean, standard deviation and size of each sample's group.

    Formula per group g with members S_g, n_g = |S_g|: ``mean_g = sum_{i in S_g} s_i / n_g``,
    ``std_g = sqrt(sum_{i in S_g} (s_i - mean_g)^2 / (n_g - 1))`` when ``unbiased`` (sample std, as ``torch.std``
    and the GRPO implementations of verl/ROLL), else divided by ``n_g`` (population std). A group of one has std 0.

    Args:
        scores: (B,) float scores.
        group_ids: (B,) integer ids, or None for one group.
        unbiased: sample (True) or population (False) standard deviation.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must have shape (B,), got {tuple(scores.shape)}; pass one score per sample")
    index, n_groups = group_index(group_ids, scores.shape[0], scores.device)
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    s = scores.to(dtype)
    count = torch.zeros(n_groups, dtype=dtype, device=s.device).index_add_(0, index, torch.ones_like(s))
    total = torch.zeros(n_groups, dtype=dtype, device=s.device).index_add_(0, index, s)
    mean = total / count
    sq_dev = torch.zeros(n_groups, dtype=dtype, device=s.device).index_add_(0, index, (s - mean[index]) ** 2)
    denom = (count - 1) if unbiased else count
    var = torch.where(denom > 0, sq_dev / denom.clamp(min=1), torch.zeros_like(sq_dev))
    return GroupStats(mean=mean[index], std=var.sqrt()[index], count=count[index])
