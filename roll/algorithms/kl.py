"""KL estimators between the policy and a reference policy, and KL coefficient controllers.

Per-token estimators use sampled-token log-probs (Schulman, "Approximating KL divergence", 2020): with
``d = log pi(a) - log pi_ref(a)`` for ``a ~ pi``, ``k1 = d``, ``k2 = 0.5 d^2`` and ``k3 = exp(-d) + d - 1`` all
estimate ``KL(pi || pi_ref)``; ``full`` computes the exact KL over the vocabulary from logits.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from roll.algorithms.masking import masked_mean
from roll.registry import Registry

LOW_VAR_KL_CLAMP = 10.0
LOG_RATIO_CLAMP = 20.0


class KLFn(Protocol):
    """Signature of a KL type: ``(log_probs (B,T), ref_log_probs (B,T)) -> (B,T)`` (``full``: logits (B,T,V))."""

    def __call__(self, log_probs: Tensor, ref_log_probs: Tensor, /) -> Tensor: ...


#: ``needs_logits``: the type compares whole distributions (B, T, V logits), not sampled-token log-probs; the
#: pipelines' workers exchange only log-probs, so config validation rejects such a type for ``kl_penalty`` and
#: ``kl_loss_type``.
KL_TYPES: Registry[KLFn] = Registry("KL type", "register_kl", capabilities={"needs_logits": False})
register_kl = KL_TYPES.register


@register_kl("kl", "k1")
def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """``log pi - log pi_ref`` (k1; unbiased, can be negative). Shapes: (B,T), (B,T) -> (B,T)."""
    return log_probs - ref_log_probs


@register_kl("abs")
def kl_abs(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """``|log pi - log pi_ref|``. Shapes: (B,T), (B,T) -> (B,T)."""
    return (log_probs - ref_log_probs).abs()


@register_kl("mse", "k2")
def kl_mse(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """``0.5 * (log pi - log pi_ref)^2`` (k2). Shapes: (B,T), (B,T) -> (B,T)."""
    return 0.5 * (log_probs - ref_log_probs).square()


@register_kl("low_var_kl", "k3")
def kl_low_var(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """``exp(r) - r - 1`` with ``r = log pi_ref - log pi`` (k3; non-negative, unbiased, low variance).

    ``r`` is clamped to [-20, 20] before ``exp`` and the result to [-10, 10], as in verl, so that a token the
    reference finds nearly impossible cannot blow up the loss. Shapes: (B,T), (B,T) -> (B,T).
    """
    r = (ref_log_probs - log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(r) - r - 1).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


@register_kl("full", needs_logits=True)
def full_kl(logits: Tensor, ref_logits: Tensor) -> Tensor:
    """Exact vocabulary KL ``sum_v p(v) (log p(v) - log q(v))``, p = softmax(logits), q = softmax(ref_logits).

    Shapes: logits (B,T,V), ref_logits (B,T,V) -> (B,T).
    """
    if logits.shape != ref_logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} must match (B,T,V)")
    logp = F.log_softmax(logits.float(), dim=-1)
    logq = F.log_softmax(ref_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1).to(logits.dtype)


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate of the registered type ``kind``.

    Args:
        log_probs: (B,T) log-probs of the sampled tokens under the policy (for ``full``: logits (B,T,V)).
        ref_log_probs: (B,T) the same under the reference (for ``full``: reference logits (B,T,V)).
        kind: ``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3`` or ``full``.
    Returns:
        (B,T) KL per token.
    """
    return KL_TYPES.get(kind)(log_probs, ref_log_probs)


def apply_kl_penalty(
    token_level_scores: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    kl_coef: float,
    kind: str,
) -> tuple[Tensor, dict[str, float]]:
    """Subtract a per-token KL penalty from the rewards (Ziegler et al. 2019; Ouyang et al. 2022).

    Formula: ``rewards_t = scores_t - kl_coef * KL_t * m_t``.

    Args:
        token_level_scores: (B,T) rewards per response token (usually the score on the last response token).
        log_probs: (B,T) policy log-probs (logits (B,T,V) for ``kind='full'``).
        ref_log_probs: (B,T) reference log-probs (logits (B,T,V) for ``kind='full'``).
        mask: (B,T) response mask.
        kl_coef: the coefficient, e.g. ``controller.value``.
        kind: a KL type name (see :func:`kl_penalty`).
    Returns:
        ``(token_level_rewards (B,T), metrics)`` with ``actor/reward_kl`` (mean over sequences of each sequence's
        mean KL; feed it to the controller's ``update``) and ``actor/reward_kl_coef``.
    """
    kl = kl_penalty(log_probs, ref_log_probs, kind)
    kl = torch.where(mask.bool(), kl, torch.zeros_like(kl))
    rewards = token_level_scores - kl_coef * kl
    has_tokens = mask.sum(dim=-1) > 0
    seq_kl = masked_mean(kl, mask, dim=-1)[has_tokens]
    mean_kl = seq_kl.mean().item() if seq_kl.numel() else 0.0
    return rewards, {"actor/reward_kl": mean_kl, "actor/reward_kl_coef": float(kl_coef)}


class FixedKLController:
    """A constant KL coefficient.

    Args:
        kl_coef: the coefficient (>= 0).
    """

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}; use 0 to disable the penalty")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient (arguments are accepted so that controllers are interchangeable)."""

    def state_dict(self) -> dict[str, Any]:
        """Return a snapshot for checkpoints."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output."""
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences".

    Update: ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``; ``value *= 1 + e * n_steps / horizon``.
    The coefficient grows while the measured KL is above target and shrinks while it is below.

    Args:
        init_kl_coef: starting coefficient (>= 0).
        target_kl: the KL to hold (> 0).
        horizon: number of samples over which the coefficient may move by ~20% (> 0).
    """

    ERROR_CLIP = 0.2

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef}")
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0 for an adaptive controller, got {target_kl}; or set it None")
        if horizon <= 0:
            raise ValueError(f"kl horizon must be > 0, got {horizon}; e.g. 10000")
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient toward holding ``target_kl``; ``n_steps`` = samples in this batch."""
        error = min(max(current_kl / self.target_kl - 1.0, -self.ERROR_CLIP), self.ERROR_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        """Return a snapshot for checkpoints."""
        return {"value": self.value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output."""
        self.value = float(state["value"])
        self.target_kl = float(state["target_kl"])
        self.horizon = int(state["horizon"])


def make_kl_controller(
    init_kl_coef: float, target_kl: float | None, horizon: int
) -> FixedKLController | AdaptiveKLController:
    """Adaptive controller when ``target_kl`` is set, else a fixed one holding ``init_kl_coef``."""
    if target_kl is None:
        return FixedKLController(init_kl_coef)
    return AdaptiveKLController(init_kl_coef, target_kl, horizon)
