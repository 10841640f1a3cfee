"""The ``run_health`` block: the bounds of the healthy ranges each step's metrics are read against.

Every bound is one field here (its default is the one place it is set); the rule that reads it, the metric, how
many steps out of range make it fire, the likely cause, the action, and where the default comes from are its entry
in :data:`roll.tracking.health.HEALTH_RULES` (docs/tracking.md, "Run health", has the table). A bound set to null
turns its rule off.
"""

from __future__ import annotations

from dataclasses import dataclass

from roll.config.fields import fld


@dataclass
class RunHealthConfig:
    """Run health: per-step metrics against healthy ranges (docs/tracking.md, "Run health")."""

    enabled: bool = fld(
        True,
        "Read every step's metrics against the healthy ranges below: a rule out of range for its number of steps "
        "prints one line (the likely cause and the action) once, and once when it recovers; health/<rule> and "
        "health/alerts count them in the metrics.",
    )
    approx_kl_max: float | None = fld(
        0.05,
        "actor/approx_kl (KL(old || new) of one update) above this is too large a step.",
        allowed="> 0; null = off",
    )
    ref_kl_max: float | None = fld(
        0.5,
        "actor/ref_kl (mean KL to the reference per token) above this: the policy drifted.",
        allowed="> 0; null = off",
    )
    grad_norm_max: float | None = fld(
        10.0, "actor/grad_norm (before clipping) above this: loss spikes.", allowed="> 0; null = off"
    )
    clip_frac_max: float | None = fld(
        0.3, "actor/clip_frac above this: updates leave PPO's trust region.", allowed="in (0, 1]; null = off"
    )
    entropy_min_ratio: float | None = fld(
        0.1,
        "actor/entropy below this fraction of its first value: the policy collapsed to near-certain tokens.",
        allowed="in (0, 1); null = off",
    )
    zero_signal_max: float | None = fld(
        0.5,
        "rollout/zero_signal_frac (groups whose advantages are all zero) above this: most groups teach nothing.",
        allowed="in [0, 1); null = off",
    )
    val_stall_evals: int | None = fld(
        3,
        "Validation success (val/success_rate, RLVR val/accuracy) without a new best in this many evaluations in "
        "a row: the run has stopped improving.",
        allowed="a whole number >= 1; null = off",
    )
    logprob_mismatch_max: float | None = fld(
        0.02,
        "rollout/logprob_mismatch (mean |engine - trainer| log-prob) above this: the engine samples from another "
        "policy than the one trained.",
        allowed="> 0; null = off",
    )
    truncated_max: float | None = fld(
        0.2,
        "Share of episodes / responses cut by the length limit (rollout/truncated_by_length, RLVR "
        "rollout/truncated_rate) above this.",
        allowed="in [0, 1); null = off",
    )
