"""Scores to advantages: score normalization, the estimator's inputs, the advantage step of the update."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from roll.algorithms.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    TurnInputs,
    compute_advantage,
    whiten_and_clip_advantages,
)
from roll.algorithms.kl import apply_kl_penalty
from roll.algorithms.losses import explained_variance
from roll.algorithms.masking import masked_mean, masked_whiten
from roll.algorithms.reward_norm import RunningMeanStd, normalize_episode_scores, postprocess_rlvr_rewards
from roll.config.agentic import AgenticConfig
from roll.config.base import BaseConfig
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.data.layout import episode_rows, episode_view, from_episode_frame, place_at_last_response, several_samples
from roll.ppo.loss_fns import loss_mask
from roll.registry import Registry


# ---------------------------------------------------------------------------- score normalization
class ScoreNormalizer(Protocol):
    """``(batch) -> (B,)`` normalized (and clipped) episode scores; its state goes into checkpoints."""

    def __call__(self, batch: Batch) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


#: The score normalization of each pipeline, named by its config's ``score_normalizer``.
SCORE_NORMALIZERS: Registry[Callable[[Any], ScoreNormalizer]] = Registry(
    "score normalizer", "register_score_normalizer"
)
register_score_normalizer = SCORE_NORMALIZERS.register


@register_score_normalizer("episode")
class EpisodeScoreNorm:
    """Agentic: ``reward_normalization`` (grouping by same-seed group, batch or env tag; a mean and a std each from the
    batch or the group, ``norm_mean_type`` / ``norm_std_type``, derived from ``method`` where unset:
    :func:`~roll.algorithms.reward_norm.normalize_episode_scores`), then ``reward_clip``."""

    def __init__(self, cfg: AgenticConfig):
        self.cfg = cfg

    def __call__(self, batch: Batch) -> torch.Tensor:
        norm = self.cfg.reward_normalization
        ids = group_keys(norm.grouping, batch)
        scores = normalize_episode_scores(batch["scores"], ids, norm.method, norm.norm_mean_type, norm.norm_std_type)
        clip = self.cfg.reward_clip
        return scores if clip is None else scores.clamp(-clip, clip)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless."""


@register_score_normalizer("response")
class RLVRScoreNorm:
    """RLVR: ``reward_norm`` (batch, group of one prompt's responses, or running statistics), ``reward_shift``,
    ``reward_scale``, ``reward_clip`` (:func:`~roll.algorithms.reward_norm.postprocess_rlvr_rewards`)."""

    def __init__(self, cfg: BaseConfig):
        self.cfg, self.running = cfg, RunningMeanStd()

    def __call__(self, batch: Batch) -> torch.Tensor:
        cfg = self.cfg
        return postprocess_rlvr_rewards(
            batch["scores"],
            torch.tensor(batch["group_id"], dtype=torch.long),
            reward_norm=cfg.reward_norm,
            reward_shift=cfg.reward_shift,
            reward_scale=cfg.reward_scale,
            reward_clip=cfg.reward_clip,
            running=self.running,
        )

    def state_dict(self) -> dict[str, Any]:
        return self.running.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.running.load_state_dict(state)


def group_keys(grouping: str, batch: Batch) -> torch.Tensor | None:
    """Group ids (dense, first-seen order) for normalization: same-seed / same-prompt group (``state``), env tag
    (``inductive``) or None (``batch``)."""
    if grouping == "batch":
        return None
    key = "group_id" if grouping == "state" else "tag"
    index: dict[Any, int] = {}
    return torch.tensor([index.setdefault(v, len(index)) for v in batch[key]], dtype=torch.long)


# ---------------------------------------------------------------------------- advantages
def turn_inputs(batch: Batch) -> TurnInputs:
    """The per-turn tensors of an estimator that ``needs_turns``, from batch metadata ``turn_spans`` ((start, end)
    per turn in the log-prob frame), ``turn_states`` (the observation each turn acted on: equal text = equal state,
    numbered in first-seen order) and ``step_rewards``; only multi-turn (agentic) batches have them."""
    missing = [k for k in ("step_rewards", "turn_states", "turn_spans") if k not in batch]
    if missing:
        raise ValueError(
            f"adv_estimator needs per-turn batch metadata {missing}; only the agentic pipeline "
            "provides turns (use grpo for single-turn data)"
        )
    state_index: dict[str, int] = {}
    rows: list[tuple[int, int, int, float, int]] = []  # (sample, start, end, reward, state) per turn
    for i in range(len(batch)):
        for reward, state, (start, end) in zip(
            batch["step_rewards"][i], batch["turn_states"][i], batch["turn_spans"][i]
        ):
            rows.append((i, start, end, float(reward), state_index.setdefault(state, len(state_index))))
    sample, start, end, rewards, states = zip(*rows) if rows else ((), (), (), (), ())
    long = torch.long
    return TurnInputs(
        torch.tensor(sample, dtype=long),
        torch.tensor(start, dtype=long),
        torch.tensor(end, dtype=long),
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(states, dtype=long),
    )


def compute_advantages(
    cfg: BaseConfig, batch: Batch, scores: torch.Tensor, group_ids: torch.Tensor | None, kl_coef: float
) -> dict[str, float]:
    """(Normalized) scores (B,) -> token rewards (+ KL penalty) -> ``cfg.adv_estimator`` -> whitened / clipped
    ``advantages`` and ``returns`` (B, L-1) stored in ``batch``; returns ``critic/*`` and ``actor/reward_kl*``
    metrics."""
    metrics: dict[str, float] = {}
    mask = loss_mask(batch)
    rewards = place_at_last_response(scores, mask)  # each (normalized) score on its last response token
    if cfg.add_token_level_kl:
        rewards, kl_metrics = apply_kl_penalty(
            rewards, batch["old_log_probs"], batch["ref_log_probs"], mask, kl_coef, cfg.kl_penalty
        )
        metrics.update(kl_metrics)
    if cfg.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    values = batch.tensors.get("values")
    turns = turn_inputs(batch) if ADVANTAGES.capabilities(cfg.adv_estimator)["needs_turns"] else None
    out = compute_advantage(
        cfg.adv_estimator,
        AdvantageInputs(
            rewards, mask, values=values, group_ids=group_ids, gamma=cfg.gamma, lambd=cfg.lambd, turns=turns
        ),
        **cfg.estimator_args(),
    )
    batch["advantages"] = whiten_and_clip_advantages(out.advantages, mask, cfg.whiten_advantages, cfg.advantage_clip)
    batch["returns"] = out.returns
    metrics.update(value_metrics(values, out.returns, mask))
    check_batch_if(cfg.strict_data_check, batch, "advantages", required=("advantages", "returns"))
    metrics.update(
        {
            "critic/advantages_mean": float(masked_mean(batch["advantages"], mask)),
            "critic/advantages_max": float(batch["advantages"][mask.bool()].max()) if mask.any() else 0.0,
            "critic/advantages_min": float(batch["advantages"][mask.bool()].min()) if mask.any() else 0.0,
            "critic/returns_mean": float(masked_mean(out.returns, mask)),
            "critic/returns_max": float(out.returns[mask.bool()].max()) if mask.any() else 0.0,
            "critic/returns_min": float(out.returns[mask.bool()].min()) if mask.any() else 0.0,
            "critic/score_mean": float(scores.mean()),
        }
    )
    return metrics


def value_metrics(values: torch.Tensor | None, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Critic diagnostics before its update: ``critic/values_mean`` and ``critic/explained_variance``
    (``1 - Var[R - V] / Var[R]`` over response tokens); empty without a critic."""
    if values is None:
        return {}
    return {
        "critic/values_mean": float(masked_mean(values, mask)),
        "critic/explained_variance": float(explained_variance(values, returns, mask)),
    }


def score_normalizer(cfg: BaseConfig) -> ScoreNormalizer:
    """The score normalization ``cfg``'s pipeline names (its ``score_normalizer``): per episode (agentic) or per
    response (RLVR)."""
    return SCORE_NORMALIZERS.get(cfg.score_normalizer)(cfg)


def advantage_step(
    cfg: BaseConfig, batch: Batch, kl_coef: float, normalizer: ScoreNormalizer | None = None
) -> dict[str, float]:
    """Scores -> ``normalizer`` (default: :func:`score_normalizer`) -> :func:`compute_advantages`, with the same-group
    ids (:func:`group_keys`) as the estimator's groups; writes ``advantages``/``returns`` into ``batch``.

    Where episodes have several samples (``trajectory_mode: step``, template breaks), all of it runs on the
    episodes (:func:`~roll.data.layout.episode_view`: one score per episode in the group statistics, the turns of
    an episode in one row for GiGPO and GAE), and every sample gets its own tokens' advantages back."""
    if several_samples(batch):
        view = episode_view(batch)
        metrics = advantage_step(cfg, view, kl_coef, normalizer)
        rows, width = episode_rows(batch), batch["response_mask"].shape[1] - 1
        batch["advantages"] = from_episode_frame(view["advantages"], rows, width)
        batch["returns"] = from_episode_frame(view["returns"], rows, width)
        return metrics
    scores = (normalizer or score_normalizer(cfg))(batch)
    return compute_advantages(cfg, batch, scores, group_keys("state", batch), kl_coef)


# ---------------------------------------------------------------------------- train/inference correction
