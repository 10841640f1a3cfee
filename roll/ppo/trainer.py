"""The PPO update both pipelines share: a batch of scored samples in, trained roles and synced weights out.

In the order of one step (CleanRL's order, after the rollout):

1. :meth:`PPOTrainer.log_probs`: old log-probs from ``actor_train`` (skipped where the training forward gives the
   same values, see :func:`~roll.ppo.epochs.skip_old_log_probs`; the engine's with ``old_log_probs_source:
   engine``), reference log-probs (from ``reference``, or, with
   LoRA, from ``actor_train`` with its adapters off), critic values.
2. :meth:`PPOTrainer.advantages`: episode scores -> the pipeline's score normalization
   (:class:`~roll.ppo.advantage_step.EpisodeScoreNorm` for agentic episodes,
   :class:`~roll.ppo.advantage_step.RLVRScoreNorm` for RLVR responses) -> the scores on the last response token ->
   KL penalty in the reward -> the registered advantage estimator -> whitening / clipping.
3. :meth:`PPOTrainer.update`: critic epochs, then actor epochs (once past ``critic_warmup``), the KL controller,
   and the weight sync to ``actor_infer``.

Every stage returns its metrics (``critic/*``, ``actor/*``, ``time/*``); the pipeline adds them to the step's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from roll.algorithms.kl import make_kl_controller
from roll.config.base import BaseConfig
from roll.config.lora import reference_from_actor, wants_reference
from roll.config.validation import engine_old_log_probs
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.data.layout import episode_rows
from roll.distributed.roles import Roles
from roll.ppo.advantage_step import advantage_step, score_normalizer
from roll.ppo.correction import apply_train_infer_correction
from roll.ppo.epochs import old_log_probs_of_engine, skip_old_log_probs, train_actor, train_critic
from roll.ppo.signal import SignalWatch


# ---------------------------------------------------------------------------- score normalization
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
        # LoRA with lora_reference adapters_off: reference log-probs from actor_train (no reference worker runs)
        self.reference_from_actor = reference_from_actor(cfg) and wants_reference(cfg)

    def log_probs(self, step: int, batch: Batch) -> dict[str, float]:
        """Old log-probs (unless skipped), reference log-probs and critic values into ``batch``; returns their
        ``time/*``."""
        cfg, roles, start, timings = self.cfg, self.roles, time.perf_counter(), {}
        episodes = len(episode_rows(batch))
        if engine_old_log_probs(cfg):  # the behaviour policy's own log-probs: no pass
            batch["old_log_probs"] = old_log_probs_of_engine(batch)
            batch.info["old_log_probs_of_engine"] = True  # nothing to compare them with (logprob_mismatch)
        elif not skip_old_log_probs(cfg, episodes, step):  # else the update's forward provides them (the same values)
            t = time.perf_counter()
            batch["old_log_probs"] = roles.actor_train.compute_log_probs(batch)
            check_batch_if(cfg.strict_data_check, batch, "old_log_probs", required=("old_log_probs",))
            timings["time/old_log_probs"] = time.perf_counter() - t
        if roles.reference is not None or self.reference_from_actor:
            t = time.perf_counter()
            if roles.reference is not None:
                batch["ref_log_probs"] = roles.reference.compute_log_probs(batch)
            else:  # LoRA: the base model is the actor with its adapters off
                batch["ref_log_probs"] = roles.actor_train.compute_base_log_probs(batch)
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
