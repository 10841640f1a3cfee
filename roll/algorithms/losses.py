"""Losses of the update step: policy (see :mod:`roll.algorithms.policy_losses`), value, entropy, and the
actor loss composition the trainer calls. Tensors are (B, T) = batch x response tokens unless stated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from roll.algorithms.aggregation import AGG_MODES, agg_loss, register_agg_mode
from roll.algorithms.kl import KL_TYPES, kl_penalty
from roll.algorithms.masking import masked_mean, masked_var
from roll.algorithms.policy_losses import (
    POLICY_LOSSES,
    get_policy_loss_fn,
    gspo_policy_loss,
    ppo_policy_loss,
    register_policy_loss,
)

__all__ = [
    "ActorLossConfig",
    "actor_loss",
    "agg_loss",
    "entropy_from_logits",
    "explained_variance",
    "get_policy_loss_fn",
    "gspo_policy_loss",
    "ppo_policy_loss",
    "register_agg_mode",
    "register_policy_loss",
    "value_loss",
]


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position.

    Formula: ``H = logsumexp(z) - sum_v softmax(z)_v z_v`` (equal to ``-sum_v p_v log p_v``), computed in float32
    (float64 input stays float64). Shapes: logits (B, T, V) -> (B, T).
    """
    z = logits if logits.dtype == torch.float64 else logits.float()
    p = torch.softmax(z, dim=-1)
    return (torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)).to(logits.dtype)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    value_clip: float | None,
    loss_agg_mode: str = "token-mean",
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss (PPO; Schulman et al. 2017, as in OpenAI baselines).

    Formula: ``V_c = old_V + clip(V - old_V, -value_clip, value_clip)``;
    ``l = 0.5 * max((V - R)^2, (V_c - R)^2)``, or ``0.5 * (V - R)^2`` when ``value_clip`` is None; aggregated by
    ``loss_agg_mode``.

    Args:
        values: (B, T) current critic values (with grad).
        old_values: (B, T) values at rollout time.
        returns: (B, T) targets (e.g. GAE returns).
        mask: (B, T) response mask.
    Returns:
        ``(loss, metrics)`` with ``critic/vf_loss``, ``critic/vf_clip_frac`` (fraction of masked tokens whose
        ``V - old_V`` the clamp changed and whose clipped branch was larger: a token inside the clip range is never
        counted, even where ``old_V + (V - old_V)`` rounds one ulp away from ``V``), ``critic/vpred_mean``.
    """
    unclipped = (values - returns).square()
    if value_clip is None:
        loss_mat, taken = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        if value_clip <= 0:
            raise ValueError(f"value_clip must be positive or None, got {value_clip}; e.g. value_clip=0.5")
        delta = values - old_values
        delta_clipped = delta.clamp(-value_clip, value_clip)
        clipped = (old_values + delta_clipped - returns).square()
        loss_mat, taken = torch.maximum(unclipped, clipped), (delta_clipped != delta) & (clipped > unclipped)
    loss = 0.5 * agg_loss(loss_mat, mask, loss_agg_mode, norm_len)
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": loss.item(),
            "critic/vf_clip_frac": float(masked_mean(taken.float(), mask)),
            "critic/vpred_mean": masked_mean(values.detach(), mask).item(),
        }
    return loss, metrics


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[R - V] / Var[R]`` over masked tokens (1: perfect critic, 0: no better than a constant).

    Shapes: values (B, T), returns (B, T), mask (B, T) -> scalar; ``nan`` when ``Var[R] = 0``.
    """
    var_returns = masked_var(returns, mask)
    if var_returns == 0:
        return torch.tensor(float("nan"), dtype=returns.dtype)
    return 1.0 - masked_var(returns - values, mask) / var_returns


@dataclass(frozen=True)
class ActorLossConfig:
    """Settings of :func:`actor_loss`.

    Attributes:
        pg_clip: symmetric PPO clip range epsilon.
        pg_clip_low: lower clip range (ratio >= 1 - pg_clip_low); None -> pg_clip.
        pg_clip_high: upper clip range (ratio <= 1 + pg_clip_high); None -> pg_clip (DAPO clip-higher: 0.28).
        dual_clip_loss: bound negative-advantage losses by dual_clip_c * |A|.
        dual_clip_c: the dual clip constant c (> 1).
        loss_agg_mode: a registered aggregation mode (see :func:`agg_loss`).
        norm_len: fixed length of ``seq-mean-token-sum-norm`` (default: T of the batch).
        entropy_loss_coef: weight of the entropy bonus (subtracted from the loss).
        use_kl_loss: add a KL-to-reference term to the loss (GRPO style).
        kl_loss_coef: weight of that KL term.
        kl_loss_type: per-token KL type of that term (a :mod:`roll.algorithms.kl` name other than ``full``).
        policy_loss: a registered policy loss (``ppo``, ``gspo``).
    """

    pg_clip: float = 0.2
    pg_clip_low: float | None = None
    pg_clip_high: float | None = None
    dual_clip_loss: bool = False
    dual_clip_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    norm_len: int | None = None
    entropy_loss_coef: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    policy_loss: str = "ppo"

    def __post_init__(self) -> None:
        if not 0 < self.clip_low < 1 or self.clip_high <= 0:
            raise ValueError(
                f"clip ranges must satisfy 0 < low < 1 and high > 0, got low={self.clip_low}, "
                f"high={self.clip_high}; check pg_clip / pg_clip_low / pg_clip_high"
            )
        if self.dual_clip_loss and self.dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c must be > 1, got {self.dual_clip_c}; e.g. 3.0")
        AGG_MODES.get(self.loss_agg_mode)
        POLICY_LOSSES.get(self.policy_loss)
        if KL_TYPES.capabilities(self.kl_loss_type)["needs_logits"]:
            raise ValueError(
                f"kl_loss_type {self.kl_loss_type!r} needs logits, which actor_loss does not take; use 'low_var_kl'"
            )
        if self.kl_loss_coef < 0 or self.entropy_loss_coef < 0:
            raise ValueError(
                f"kl_loss_coef ({self.kl_loss_coef}) and entropy_loss_coef ({self.entropy_loss_coef}) must be >= 0"
            )

    @property
    def clip_low(self) -> float:
        """Effective lower clip range."""
        return self.pg_clip if self.pg_clip_low is None else self.pg_clip_low

    @property
    def clip_high(self) -> float:
        """Effective upper clip range."""
        return self.pg_clip if self.pg_clip_high is None else self.pg_clip_high


def actor_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: ActorLossConfig,
    *,
    entropy: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Actor objective: ``L = L_pg + kl_loss_coef * agg(KL(pi, pi_ref)) - entropy_loss_coef * agg(H)``.

    The KL term is present when ``cfg.use_kl_loss`` (needs ``ref_log_probs``), the entropy term when
    ``cfg.entropy_loss_coef > 0`` (needs ``entropy``); both use ``cfg.loss_agg_mode``.

    Args:
        log_probs, old_log_probs, advantages, mask: (B, T), see :func:`ppo_policy_loss`.
        cfg: the settings.
        entropy: (B, T) per-token entropy (e.g. :func:`entropy_from_logits`), optional.
        ref_log_probs: (B, T) reference log-probs, optional.
    Returns:
        ``(loss, metrics)``: the policy loss metrics plus ``actor/loss``, ``actor/entropy`` (token mean, when
        ``entropy`` is given), ``actor/ref_kl`` (token mean of k1 = logp - ref_logp, when ``ref_log_probs`` is
        given) and ``actor/kl_loss`` (when ``use_kl_loss``).
    """
    policy_fn = POLICY_LOSSES.get(cfg.policy_loss)
    loss, metrics = policy_fn(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip_c if cfg.dual_clip_loss else None,
        loss_agg_mode=cfg.loss_agg_mode,
        norm_len=cfg.norm_len,
    )
    if cfg.entropy_loss_coef > 0 and entropy is None:
        raise ValueError(f"entropy_loss_coef={cfg.entropy_loss_coef} needs the per-token entropy; pass entropy=")
    if entropy is not None:
        metrics["actor/entropy"] = float(masked_mean(entropy.detach(), mask))
        if cfg.entropy_loss_coef > 0:
            loss = loss - cfg.entropy_loss_coef * agg_loss(entropy, mask, cfg.loss_agg_mode, cfg.norm_len)
    if cfg.use_kl_loss and ref_log_probs is None:
        raise ValueError("use_kl_loss=True needs reference log-probs; pass ref_log_probs= (or set use_kl_loss False)")
    if ref_log_probs is not None:
        metrics["actor/ref_kl"] = float(masked_mean((log_probs - ref_log_probs).detach(), mask))
    if cfg.use_kl_loss:
        assert ref_log_probs is not None  # checked above
        kl = kl_penalty(log_probs, ref_log_probs, cfg.kl_loss_type)
        kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, cfg.norm_len)
        metrics["actor/kl_loss"] = kl_loss.detach().item()
        loss = loss + cfg.kl_loss_coef * kl_loss
    metrics["actor/loss"] = loss.detach().item()
    return loss, metrics
