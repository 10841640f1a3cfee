"""Policy-gradient losses (one registry); all share the :class:`PolicyLossFn` signature.

Tensors are (B, T) = batch x response tokens. Metrics are python floats with ``actor/`` keys.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from roll.algorithms.aggregation import agg_loss
from roll.algorithms.masking import masked_mean
from roll.registry import Registry

LOG_RATIO_CLAMP = 20.0


class PolicyLossFn(Protocol):
    """Signature of a policy loss: returns ``(scalar loss, metrics)``."""

    def __call__(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        loss_agg_mode: str = "token-mean",
        norm_len: int | None = None,
    ) -> tuple[Tensor, dict[str, float]]: ...


POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "register_policy_loss")
register_policy_loss = POLICY_LOSSES.register


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the policy loss registered as ``name`` (a KeyError lists the valid names)."""
    return POLICY_LOSSES.get(name)


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token clipped (and optionally dual-clipped) surrogate loss.

    ``l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; with dual clip c, for ``A < 0``:
    ``l = min(l, -A c) = min(l, c |A|)``. Returns ``(loss (B,T), clip_taken (B,T) bool, dual_taken (B,T) bool)``.
    """
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_taken = clipped > unclipped
    dual_taken = torch.zeros_like(clip_taken)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (a bound c * |A| on negative-advantage losses), got {dual_clip}")
        bound = -advantages * dual_clip
        negative = advantages < 0
        dual_taken = negative & (bound < loss)
        loss = torch.where(negative, torch.minimum(loss, bound), loss)
    return loss, clip_taken, dual_taken


def _metrics(pg_loss: Tensor, log_ratio: Tensor, clip_taken: Tensor, dual_taken: Tensor, mask: Tensor) -> dict:
    """Standard PPO diagnostics; approx_kl is the k3 estimate of KL(pi_old || pi) on tokens drawn from pi_old."""
    with torch.no_grad():
        ratio = log_ratio.exp()
        k3 = ratio - 1.0 - log_ratio
        return {
            "actor/pg_loss": pg_loss.detach().item(),
            "actor/clip_frac": float(masked_mean(clip_taken.float(), mask)),
            "actor/dual_clip_frac": float(masked_mean(dual_taken.float(), mask)),
            "actor/approx_kl": float(masked_mean(k3, mask)),
            "actor/ratio_mean": float(masked_mean(ratio, mask)),
        }


@register_policy_loss("ppo")
def ppo_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    loss_agg_mode: str = "token-mean",
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017) with asymmetric clip (DAPO clip-higher, Yu et al. 2025,
    arXiv:2503.14476) and optional dual clip (Ye et al. 2020, arXiv:1912.09729).

    Per token: ``r = exp(logp - old_logp)`` (log-ratio clamped to [-20, 20]),
    ``l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; with ``dual_clip`` c > 1 and ``A < 0``:
    ``l = min(l, c |A|)``. Loss = ``agg_loss(l, mask, loss_agg_mode, norm_len)``.

    Args:
        log_probs: (B, T) current policy log-probs of the sampled tokens (with grad).
        old_log_probs: (B, T) log-probs under the policy that sampled them.
        advantages: (B, T) advantages.
        mask: (B, T) response mask.
    Returns:
        ``(loss, metrics)``: ``actor/pg_loss``, ``actor/clip_frac`` (fraction of masked tokens where the clipped
        branch was taken), ``actor/dual_clip_frac``, ``actor/approx_kl`` (k3 estimate of KL(old || new):
        mean of ``r - 1 - log r``), ``actor/ratio_mean``.
    """
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss_mat, clip_taken, dual_taken = _clipped_surrogate(log_ratio.exp(), advantages, clip_low, clip_high, dual_clip)
    loss = agg_loss(loss_mat, mask, loss_agg_mode, norm_len)
    return loss, _metrics(loss, log_ratio.detach(), clip_taken, dual_taken, mask)


@register_policy_loss("gspo")
def gspo_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): the PPO surrogate with a sequence-level importance ratio.

    ``log s_i = mean_t m_it (logp_it - old_logp_it)``; per token the ratio is
    ``s_it = sg(s_i) * pi_it / sg(pi_it)`` (value s_i, gradient of log pi_it) and the clipped surrogate of
    :func:`ppo_policy_loss` is applied to it. The paper uses tiny clip ranges (3e-4 / 4e-4) and
    ``seq-mean-token-mean``. Shapes as in :func:`ppo_policy_loss`; metrics have the same keys.
    """
    token_log_ratio = log_probs - old_log_probs
    seq_log_ratio = masked_mean(token_log_ratio, mask, dim=-1)  # (B,)
    log_ratio = seq_log_ratio.detach()[:, None] + log_probs - log_probs.detach()  # (B, T)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss_mat, clip_taken, dual_taken = _clipped_surrogate(log_ratio.exp(), advantages, clip_low, clip_high, dual_clip)
    loss = agg_loss(loss_mat, mask, loss_agg_mode, norm_len)
    return loss, _metrics(loss, token_log_ratio.detach(), clip_taken, dual_taken, mask)
