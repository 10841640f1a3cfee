"""Backward recursions (returns, GAE) over the response tokens of a (B, T) batch.

Multi-turn samples interleave model tokens (mask 1) with observation tokens (mask 0), possibly in several
separate spans. The recursions treat the masked tokens of a row as its consecutive time steps and skip the
unmasked ones: the "next step" of a masked position is the next masked position to its right. The episode ends
after the last masked token (bootstrap value 0). Rewards and values at unmasked positions are ignored, and
outputs there are 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(rewards: Tensor, mask: Tensor, gamma: float, name: str = "gamma") -> None:
    """Validate shapes (B, T) and a discount in [0, 1]."""
    if rewards.dim() != 2 or rewards.shape != mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and response_mask {tuple(mask.shape)} must both be (B, T); "
            "pass token-level tensors"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {gamma}")


@torch.no_grad()
def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted return-to-go over masked positions.

    Formula: ``G_t = r_t + gamma * G_{n(t)}`` for masked t, where n(t) is the next masked position of the row
    (``G = 0`` past the last one); ``G_t = 0`` at unmasked t. With ``gamma = 1`` this is a reverse cumulative sum.

    Args:
        rewards: (B, T) token-level rewards.
        mask: (B, T) response mask.
        gamma: discount per masked token, in [0, 1].
    Returns:
        (B, T) returns.
    """
    _check(rewards, mask, gamma)
    m = mask.bool()
    r = torch.where(m, rewards, torch.zeros_like(rewards))
    if gamma == 1.0:
        suffix = r.flip(-1).cumsum(-1).flip(-1)
        return torch.where(m, suffix, torch.zeros_like(suffix))
    running = torch.zeros_like(r[:, 0])
    columns = []
    for t in reversed(range(r.shape[1])):
        running = torch.where(m[:, t], r[:, t] + gamma * running, running)
        columns.append(torch.where(m[:, t], running, torch.zeros_like(running)))
    return torch.stack(columns[::-1], dim=1)


@torch.no_grad()
def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lambd: float) -> Tensor:
    """Generalized Advantage Estimation (Schulman et al. 2016) over masked positions.

    Formula, for masked t with next masked position n(t): ``delta_t = r_t + gamma * V_{n(t)} - V_t`` and
    ``A_t = delta_t + gamma * lambd * A_{n(t)}`` (``V = A = 0`` past the last masked token); ``A_t = 0`` at
    unmasked t.

    Args:
        rewards: (B, T) token-level rewards.
        values: (B, T) critic values.
        mask: (B, T) response mask.
        gamma: discount in [0, 1].
        lambd: GAE lambda in [0, 1].
    Returns:
        (B, T) advantages.
    """
    _check(rewards, mask, gamma)
    _check(values, mask, lambd, name="lambd")
    m = mask.bool()
    zero = torch.zeros_like(rewards[:, 0])
    next_value, next_adv = zero, zero
    columns = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lambd * next_adv
        next_value = torch.where(m[:, t], values[:, t], next_value)
        next_adv = torch.where(m[:, t], adv, next_adv)
        columns.append(torch.where(m[:, t], adv, zero))
    return torch.stack(columns[::-1], dim=1)
