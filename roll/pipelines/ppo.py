"""The PPO update both pipelines share: a batch of scored samples in, trained roles and synced weights out.

In the order of one step (CleanRL's order, after the rollout):

1. :meth:`PPOTrainer.log_probs`: old log-probs from ``actor_train`` (skipped where the training forward gives the
   same values, see :func:`~roll.pipelines.epochs.skip_old_log_probs`), reference log-probs, critic values.
2. :meth:`PPOTrainer.advantages`: episode scores -> the pipeline's score normalization (:class:`EpisodeScoreNorm`
   for agentic episodes, :class:`RLVRScoreNorm` for RLVR responses) -> the scores on the last response token ->
   KL penalty in the reward -> the registered advantage estimator -> whitening / clipping.
3. :meth:`PPOTrainer.update`: critic epochs, then actor epochs (once past ``critic_warmup``), the KL controller,
   and the weight sync to ``actor_infer``.

Every stage returns its metrics (``critic/*``, ``actor/*``, ``time/*``); the pipeline adds them to the step's.
"""

from __future__ import annotations

import sys
import time
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
from roll.algorithms.kl import apply_kl_penalty, make_kl_controller
from roll.algorithms.losses import explained_variance
from roll.algorithms.masking import masked_mean, masked_whiten
from roll.algorithms.offpolicy import importance_weights, prob_diff_band_mask, ratio_band_mask
from roll.algorithms.reward_norm import RunningMeanStd, normalize_scores, postprocess_rlvr_rewards
from roll.config.agentic import AgenticConfig
from roll.config.base import BaseConfig, TrainInferCorrectionConfig
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.data.layout import episode_rows, episode_view, from_episode_frame, place_at_last_response, several_samples
from roll.distributed.roles import Roles
from roll.pipelines.epochs import skip_old_log_probs, train_actor, train_critic
from roll.pipelines.errors import RunStopped
from roll.pipelines.loss_fns import loss_mask
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
    """Agentic: ``reward_normalization`` (grouping by same-seed group, batch or env tag; method from the score-norm
    registry), then ``reward_clip``."""

    def __init__(self, cfg: AgenticConfig):
        self.cfg = cfg

    def __call__(self, batch: Batch) -> torch.Tensor:
        norm = self.cfg.reward_normalization
        scores = normalize_scores(batch["scores"], group_keys(norm.grouping, batch), norm.method)
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
def apply_train_infer_correction(cfg: TrainInferCorrectionConfig, batch: Batch) -> dict[str, float]:
    """ROLL's ``train_infer_correction`` on a batch with ``old_log_probs`` and the engine's ``rollout_log_probs``:
    stores ``train_infer_is_weight`` (truncated importance weights, 1 where off) and ``train_infer_mask`` (the
    filters' product), both (B, L-1), which the actor loss applies (:mod:`roll.algorithms.offpolicy`); returns
    ``actor/is_weight_*`` and ``actor/train_infer_masked_frac``."""
    response = loss_mask(batch)
    mask = response * batch["rollout_log_prob_mask"]  # tokens with both log-probs
    old, behaviour = batch["old_log_probs"].float(), batch["rollout_log_probs"].float()
    metrics: dict[str, float] = {}
    if cfg.is_weight.enabled:
        batch["train_infer_is_weight"], metrics = importance_weights(
            old, behaviour, mask, cfg.is_weight.weight_type, cfg.is_weight.upper_bound
        )
    keep = torch.ones_like(mask)
    for f in (f for f in cfg.filters if f.enabled):
        if f.ratio_enabled:
            keep = keep * ratio_band_mask(old, behaviour, mask, f.agg_type, f.ratio_low, f.ratio_high)
        if f.diff_enabled:
            keep = keep * prob_diff_band_mask(old, behaviour, mask, f.agg_type, f.diff_low, f.diff_high)
    if any(f.enabled for f in cfg.filters):
        batch["train_infer_mask"] = keep
        metrics["actor/train_infer_masked_frac"] = float(((1 - keep) * response).sum() / response.sum().clamp(min=1))
    return metrics


# ---------------------------------------------------------------------------- a dead learning signal
class NoLearningSignal(RunStopped):
    """``zero_signal_patience`` steps in a row had only zero advantages: the run stops (one line, the cause)."""


def zero_signal_groups(batch: Batch) -> tuple[int, int]:
    """``(groups whose advantages are all zero on response tokens, groups)`` by ``group_id``."""
    moved = (batch["advantages"] * loss_mask(batch)).abs().sum(-1) > 0  # (B,)
    alive: dict[Any, bool] = {}
    for gid, m in zip(batch["group_id"], moved.tolist()):
        alive[gid] = alive.get(gid, False) or m
    return sum(not a for a in alive.values()), len(alive)


def dead_signal_cause(batch: Batch) -> str:
    """The likely reason a step's advantages are all zero, from its scores and groups."""
    scores, groups = batch["scores"].float(), batch["group_id"]
    if len(set(groups)) == len(groups):
        return (
            "every group has one sample, and group-normalized advantages of a single sample are 0: use "
            "group_size / num_return_sequences_in_group >= 2"
        )
    if bool((scores == scores[0]).all()):
        return (
            f"every sample scored {float(scores[0]):g}: the policy solves all or none of the tasks (make them "
            f"easier or harder, or warm-start longer), or the reward function returns a constant"
        )
    return (
        "within each group every sample scored the same (groups solved all-or-none): more samples per group "
        "or more varied tasks give contrast"
    )


class SignalWatch:
    """Counts steps whose advantages are all zero: ``rollout/zero_signal_groups`` every step, a warning with the
    likely cause on the first dead step, and :class:`NoLearningSignal` after ``patience`` dead steps in a row
    (0 = never)."""

    def __init__(self, patience: int):
        self.patience, self.dead_in_row, self.warned = patience, 0, False

    def __call__(self, step: int, batch: Batch) -> dict[str, float]:
        zero, groups = zero_signal_groups(batch)
        if zero < groups or not groups:
            self.dead_in_row = 0
            return {"rollout/zero_signal_groups": float(zero)}
        self.dead_in_row += 1
        cause = dead_signal_cause(batch)
        if not self.warned:
            self.warned = True
            print(
                f"[roll] warning: step {step}: every advantage is zero, so this step does not train the actor: "
                f"{cause} (the run stops after zero_signal_patience={self.patience} such steps in a row; 0 = "
                f"never)",
                file=sys.stderr,
                flush=True,
            )
        if self.patience and self.dead_in_row >= self.patience:
            raise NoLearningSignal(
                f"{self.dead_in_row} steps in a row (up to step {step}) had only zero "
                f"advantages, so nothing was trained: {cause}; zero_signal_patience="
                f"{self.patience} (0 = never stop)"
            )
        return {"rollout/zero_signal_groups": float(zero)}


# ---------------------------------------------------------------------------- the update
class PPOTrainer:
    """The update of one step over the run's :class:`~roll.distributed.roles.Roles` (see the module docstring).

    Args:
        cfg: the pipeline config (its PPO keys).
        roles: the started roles.
        sync_infer: syncs actor_train's weights to actor_infer; returns ``time/sync`` and ``sync/*`` metrics.
        infer_released: whether actor_infer released its memory (it then needs a sync even when none is due).
    """

    def __init__(
        self,
        cfg: BaseConfig,
        roles: Roles,
        sync_infer: Callable[[], dict[str, float]],
        infer_released: Callable[[], bool] = lambda: False,
    ):
        self.cfg, self.roles, self.sync_infer, self.infer_released = cfg, roles, sync_infer, infer_released
        self.normalizer = score_normalizer(cfg)
        self.kl_ctl = make_kl_controller(cfg.init_kl_coef, cfg.target_kl, cfg.kl_horizon)
        self.signal = SignalWatch(cfg.zero_signal_patience)

    def log_probs(self, step: int, batch: Batch) -> dict[str, float]:
        """Old log-probs (unless skipped), reference log-probs and critic values into ``batch``; returns their
        ``time/*``."""
        cfg, roles, start, timings = self.cfg, self.roles, time.perf_counter(), {}
        episodes = len(episode_rows(batch))
        if not skip_old_log_probs(cfg, episodes, step):  # else the update's forward provides them (the same values)
            t = time.perf_counter()
            batch["old_log_probs"] = roles.actor_train.compute_log_probs(batch)
            check_batch_if(cfg.strict_data_check, batch, "old_log_probs", required=("old_log_probs",))
            timings["time/old_log_probs"] = time.perf_counter() - t
        if roles.reference is not None:
            t = time.perf_counter()
            batch["ref_log_probs"] = roles.reference.compute_log_probs(batch)
            check_batch_if(cfg.strict_data_check, batch, "ref_log_probs", required=("ref_log_probs",))
            timings["time/ref_log_probs"] = time.perf_counter() - t
        if roles.critic is not None:
            t = time.perf_counter()
            batch["values"] = roles.critic.compute_values(batch)
            timings["time/values"] = time.perf_counter() - t
        timings["time/log_probs"] = time.perf_counter() - start
        return timings

    def advantages(self, batch: Batch, step: int = 0) -> dict[str, float]:
        """:func:`advantage_step` with this run's score normalization and KL coefficient, then the dead-signal
        watch (:class:`SignalWatch`: ``rollout/zero_signal_groups``; raises :class:`NoLearningSignal`)."""
        metrics = advantage_step(self.cfg, batch, self.kl_ctl.value, self.normalizer)
        metrics.update(self.signal(step, batch))
        return metrics

    def update(self, step: int, batch: Batch, reward_kl: float | None = None) -> dict[str, float]:
        """Critic first (its warm-up steps skip the actor), then the actor, the KL controller (following
        ``reward_kl``, the KL measured in the reward: ``actor/reward_kl`` of :meth:`advantages`) and the weight
        sync; returns their metrics (``critic/*``, ``actor/*``, ``sync/*``, ``time/train``, ``time/sync``)."""
        cfg, roles, metrics = self.cfg, self.roles, {}
        t, seed = time.perf_counter(), cfg.seed * 100_003 + step
        if roles.critic is not None:
            metrics.update(train_critic(cfg, roles.critic, batch, seed))
        actor_trains = step > cfg.critic_warmup
        if actor_trains:
            if cfg.train_infer_correction.on():
                metrics.update(apply_train_infer_correction(cfg.train_infer_correction, batch))
            metrics.update(train_actor(cfg, roles.actor_train, batch, seed))
        metrics["time/train"] = time.perf_counter() - t
        if cfg.add_token_level_kl:
            self.kl_ctl.update(reward_kl, n_steps=len(episode_rows(batch)))  # episodes, in step mode too
        metrics["actor/kl_coef"] = self.kl_ctl.value
        due = actor_trains and step % cfg.actor_infer.model_update_frequency == 0
        if due or self.infer_released():  # a released engine gets its weights back by a sync
            metrics.update(self.sync_infer())
        return metrics
