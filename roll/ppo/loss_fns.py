"""Loss functions handed to ``TrainStrategy.train_step``: they read a micro-batch and call the pure algorithms.

Signature (``roll.strategies.base.LossFn``): ``(log_probs (B,L-1), entropy (B,L-1) | None, micro_batch) ->
(loss, metrics)``, where ``loss`` is the micro-batch's mean over its unit; ``normalizer(micro_batch)`` counts that
unit (tokens or sequences), so a strategy can weight micro-batches into the exact loss of the whole batch (see
:mod:`roll.strategies.microbatch`). The loss objects are small frozen dataclasses, so they pickle to Ray workers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from roll.algorithms.aggregation import agg_normalizer
from roll.algorithms.losses import ActorLossConfig, actor_loss, value_loss
from roll.algorithms.masking import masked_mean
from roll.data import layout
from roll.data.batch import Batch


def loss_mask(mb: Batch) -> torch.Tensor:
    """The micro-batch's (B, L-1) float loss mask (:func:`roll.data.layout.loss_mask`)."""
    return layout.loss_mask(mb["response_mask"])


def actor_mask(mb: Batch) -> torch.Tensor:
    """:func:`loss_mask` times the train/inference correction's filter (``train_infer_mask``, when present)."""
    mask = loss_mask(mb)
    return mask * mb["train_infer_mask"].to(mask.dtype) if "train_infer_mask" in mb else mask


def sft_loss(log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: Batch) -> tuple[torch.Tensor, dict]:
    """Negative log-likelihood of the response tokens (token mean)."""
    loss = -masked_mean(log_probs, loss_mask(mb).to(log_probs.device))
    return loss, {"sft/loss": loss.item()}


def ppo_actor_loss(
    log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: Batch, cfg: ActorLossConfig
) -> tuple[torch.Tensor, dict]:
    """The actor objective of :func:`roll.algorithms.losses.actor_loss` on one micro-batch.

    Samples of episodes (``loss_weights`` from :func:`~roll.algorithms.aggregation.episode_token_weights`, set
    for a sequence ``loss_agg_mode`` where episodes have several samples) aggregate as their episodes would: the
    weighted token sum over the micro-batch's episode fractions (``episode_fraction``, summing to 1 per episode).

    Without ``old_log_probs`` in the micro-batch (the separate pass was skipped because it would be identical: one
    ppo epoch, one optimizer step per rollout batch), the old log-probs are this forward's, detached: ratio 1."""
    ref = mb.tensors.get("ref_log_probs")
    old = mb["old_log_probs"] if "old_log_probs" in mb else log_probs.detach()
    advantages = mb["advantages"]
    if "train_infer_is_weight" in mb:  # decoupled PPO: w * loss = the loss of w * A for w >= 0
        advantages = advantages * mb["train_infer_is_weight"]
    weights = mb.tensors.get("loss_weights")
    mask = actor_mask(mb) if weights is None else weights
    run_cfg = cfg if weights is None else replace(cfg, loss_agg_mode="token-mean")
    loss, metrics = actor_loss(
        log_probs,
        old.to(log_probs.device),
        advantages.to(log_probs.device),
        mask.to(log_probs.device),
        run_cfg,
        entropy=entropy,
        ref_log_probs=None if ref is None else ref.to(log_probs.device),
    )
    if weights is not None:  # sum_it l_it W_it / sum_i f_i: episodes weigh as in one-sample-per-episode layouts
        scale = float(weights.sum()) / float(mb["episode_fraction"].sum())
        loss = loss * scale
        for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss"):
            if key in metrics:
                metrics[key] *= scale
    return loss, metrics


def critic_value_loss(
    values: torch.Tensor, entropy: torch.Tensor | None, mb: Batch, value_clip: float | None
) -> tuple[torch.Tensor, dict]:
    """The critic objective of :func:`roll.algorithms.losses.value_loss` (token mean) on one micro-batch:
    ``values`` (B, L-1) from the critic, old values ``mb["values"]``, targets ``mb["returns"]``."""
    return value_loss(
        values,
        mb["values"].to(values.device),
        mb["returns"].to(values.device),
        loss_mask(mb).to(values.device),
        value_clip=value_clip,
        loss_agg_mode="token-mean",
    )


@dataclass(frozen=True)
class SFTLoss:
    """:func:`sft_loss`; a token mean."""

    def __call__(self, log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: Batch):
        return sft_loss(log_probs, entropy, mb)

    def normalizer(self, mb: Batch) -> float:
        """Response tokens of the micro-batch."""
        return float(loss_mask(mb).sum())


@dataclass(frozen=True)
class PPOActorLoss:
    """:func:`ppo_actor_loss` with settings ``cfg``; averages over ``cfg.loss_agg_mode``'s unit."""

    cfg: ActorLossConfig

    def __call__(self, log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: Batch):
        return ppo_actor_loss(log_probs, entropy, mb, self.cfg)

    def normalizer(self, mb: Batch) -> float:
        """Tokens or sequences of the micro-batch, per the aggregation mode (episodes, counted by their fractions,
        where samples carry ``loss_weights``)."""
        if "loss_weights" in mb:
            return float(mb["episode_fraction"].sum())
        return agg_normalizer(actor_mask(mb), self.cfg.loss_agg_mode)


@dataclass(frozen=True)
class CriticValueLoss:
    """:func:`critic_value_loss` with ``value_clip``; a token mean."""

    value_clip: float | None = None

    def __call__(self, values: torch.Tensor, entropy: torch.Tensor | None, mb: Batch):
        return critic_value_loss(values, entropy, mb, self.value_clip)

    def normalizer(self, mb: Batch) -> float:
        """Response tokens of the micro-batch."""
        return float(loss_mask(mb).sum())


SFT_LOSS = SFTLoss()
