"""The training epochs of the update (:mod:`roll.ppo.trainer`): the actor's and the critic's ``ppo_epochs``
passes over shuffled mini-batches of their global train batch, with the loss objects of
:mod:`roll.ppo.loss_fns`."""

from __future__ import annotations

from typing import Any

import torch

from roll.algorithms.aggregation import episode_token_weights, is_token_unit
from roll.algorithms.losses import ActorLossConfig
from roll.config.base import BaseConfig
from roll.config.validation import global_train_batch, trainer_old_log_probs_needed_by
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.data.layout import episode_rows, from_episode_frame, several_samples, to_episode_frame
from roll.distributed.roles import CriticProxy, TrainProxy
from roll.ppo.loss_fns import CriticValueLoss, PPOActorLoss, actor_mask, loss_mask


def actor_loss_config(cfg: BaseConfig) -> ActorLossConfig:
    """The actor loss settings from the config's PPO keys; ``seq-mean-token-sum-norm`` divides by the fixed
    ``sequence_length`` (never by a micro-batch's padded width, which varies)."""
    return ActorLossConfig(
        pg_clip=cfg.pg_clip,
        pg_clip_low=cfg.pg_clip_low,
        pg_clip_high=cfg.pg_clip_high,
        dual_clip_loss=cfg.dual_clip_loss,
        dual_clip_c=cfg.dual_clip_c,
        loss_agg_mode=cfg.loss_agg_mode,
        norm_len=cfg.sequence_length,
        entropy_loss_coef=cfg.entropy_loss_coef,
        use_kl_loss=cfg.use_kl_loss,
        kl_loss_coef=cfg.kl_loss_coef,
        kl_loss_type=cfg.kl_loss_type,
        policy_loss=cfg.policy_loss,
    )


def actor_mini_batch(cfg: BaseConfig) -> int:
    """Samples of one actor optimizer step over all ranks: per_device x gradient_accumulation_steps x data-parallel
    size (:func:`roll.config.validation.global_train_batch`)."""
    return global_train_batch(cfg.actor_train)


def skip_old_log_probs(cfg: BaseConfig, batch_size: int, step: int) -> bool:
    """Whether step ``step``'s separate old-log-prob pass can be skipped because it would equal the training
    forward's (detached) log-probs: ``skip_old_log_probs`` on, the actor trains this step (past
    ``critic_warmup``), one ppo epoch, the whole batch one optimizer step (so the forward runs before any update),
    and no setting that needs the old log-probs before the update
    (:func:`~roll.config.validation.trainer_old_log_probs_needed_by`)."""
    return (
        cfg.skip_old_log_probs
        and step > cfg.critic_warmup
        and cfg.ppo_epochs == 1
        and batch_size == actor_mini_batch(cfg)
        and trainer_old_log_probs_needed_by(cfg) is None
    )


def old_log_probs_of_engine(batch: Batch) -> torch.Tensor:
    """``old_log_probs_source: engine``: the engine's sampling log-probs (``rollout_log_probs``) as the old
    log-probs, (B, L-1). Every trained token must have one (an end-of-turn token appended after a length cut is
    not trained); a ValueError says how many do not (an inference strategy that returns no log-probs)."""
    if "rollout_log_probs" not in batch:
        raise ValueError("old_log_probs_source='engine': the batch has no engine log-probs (rollout_log_probs)")
    trained = loss_mask(batch) > 0
    missing = int((trained & (batch["rollout_log_prob_mask"] <= 0)).sum())
    if missing:
        raise ValueError(
            f"old_log_probs_source='engine': {missing} of {int(trained.sum())} trained tokens have no engine "
            "log-prob (the inference strategy returned none for them); set old_log_probs_source: trainer"
        )
    return batch["rollout_log_probs"].float() * batch["rollout_log_prob_mask"]


def train_actor(cfg: BaseConfig, train: TrainProxy, batch: Batch, seed: int) -> dict[str, float]:
    """``ppo_epochs`` passes over shuffled mini-batches of the global train batch; mean metrics. Without
    ``old_log_probs`` in ``batch`` (:func:`skip_old_log_probs`), the training forward's log-probs are stored there."""
    skipped = "old_log_probs" not in batch
    required = ("advantages",) if skipped else ("old_log_probs", "advantages")
    check_batch_if(cfg.strict_data_check, batch, "train_step", required=required)
    loss_fn = PPOActorLoss(actor_loss_config(cfg))
    add_episode_loss_weights(batch, cfg.loss_agg_mode, cfg.sequence_length)
    return _train_epochs(
        cfg.ppo_epochs,
        train,
        batch,
        actor_mini_batch(cfg),
        seed,
        loss_fn=loss_fn,
        with_entropy=True,
        keep_log_probs=skipped,
    )


def add_episode_loss_weights(batch: Batch, loss_agg_mode: str, norm_len: int | None) -> None:
    """Where episodes have several samples and ``loss_agg_mode`` averages over sequences, store
    ``loss_weights`` (B, L-1): :func:`~roll.algorithms.aggregation.episode_token_weights` of each episode, so that
    its samples together weigh what the episode weighs as one sample (:class:`PPOActorLoss` applies them)."""
    if several_samples(batch) and not is_token_unit(loss_agg_mode):
        rows, mask = episode_rows(batch), actor_mask(batch)
        weights = episode_token_weights(to_episode_frame(mask, rows), loss_agg_mode, norm_len)
        batch["loss_weights"] = from_episode_frame(weights, rows, mask.shape[1])


def train_critic(cfg: BaseConfig, critic: CriticProxy, batch: Batch, seed: int) -> dict[str, float]:
    """The critic's ``ppo_epochs`` passes: clipped value loss (``value_clip``) of its values against
    ``batch["returns"]``, old values = ``batch["values"]``; mean ``critic/*`` metrics."""
    mini = global_train_batch(cfg.critic)
    return _train_epochs(cfg.ppo_epochs, critic, batch, mini, seed, loss_fn=CriticValueLoss(cfg.value_clip))


def _train_epochs(
    epochs: int, role: TrainProxy, batch: Batch, mini: int, seed: int, keep_log_probs: bool = False, **train_kwargs: Any
) -> dict[str, float]:
    """``epochs`` passes over shuffled mini-batches of ``mini`` samples (one ``train_step`` each); mean metrics.
    Where episodes have several samples (``trajectory_mode: step``, template breaks), a mini-batch is ``mini``
    episodes with all their samples, trained as one optimizer step, so the learning-rate schedule counts batches
    of episodes (ROLL #409: counted per sample, it ran out K times too fast).

    ``keep_log_probs`` (one epoch, one mini-batch): store the training forward's log-probs as
    ``batch["old_log_probs"]``, in batch order."""
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, float] = {}
    count = 0
    episodes = episode_rows(batch) if several_samples(batch) else None
    units = len(episodes) if episodes is not None else len(batch)
    for _ in range(epochs):
        order = torch.randperm(units, generator=gen)
        for start in range(0, units, mini):
            index = order[start : start + mini]
            if episodes is not None:  # mini episodes with all their samples
                index = torch.tensor([i for e in index.tolist() for i in episodes[e]], dtype=torch.long)
            mini_batch = batch.select(index)
            if episodes is not None:
                mini_batch.info["one_optimizer_step"] = True
            results = role.train_step(mini_batch, return_log_probs=keep_log_probs, **train_kwargs)
            if keep_log_probs:
                kept = torch.cat([r.pop("log_probs") for r in results])  # rank chunks are consecutive
                old = torch.zeros(len(batch), kept.shape[1])
                old[index] = kept
                batch["old_log_probs"] = old
            for rank_metrics in results:
                for k, v in rank_metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
    return {k: v / max(1, count) for k, v in sums.items()}
