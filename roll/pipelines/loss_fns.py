"""Loss functions handed to ``TrainStrategy.train_step``: they read a micro-batch and call the pure algorithms.

Signature (``roll.strategies.base.LossFn``): ``(log_probs (B,L-1), entropy (B,L-1) | None, micro_batch) ->
(loss, metrics)``. Module-level functions (bound with ``functools.partial``) so they pickle to Ray workers.
"""

from __future__ import annotations

import torch

from roll.algorithms.losses import ActorLossConfig, actor_loss, value_loss
from roll.algorithms.masking import masked_mean
from roll.data.batch import Batch


def loss_mask(mb: Batch) -> torch.Tensor:
    """Response mask aligned with the log-probs: token t+1 is scored at index t. (B, L-1) float."""
    return mb["response_mask"][:, 1:].to(torch.float32)


def sft_loss(log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: Batch) -> tuple[torch.Tensor, dict]:
    """Negative log-likelihood of the response tokens (token mean)."""
    loss = -masked_mean(log_probs, loss_mask(mb))
    return loss, {"sft/loss": loss.item()}


def ppo_actor_loss(log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: Batch,
                   cfg: ActorLossConfig) -> tuple[torch.Tensor, dict]:
    """The actor objective of :func:`roll.algorithms.losses.actor_loss` on one micro-batch."""
    ref = mb.tensors.get("ref_log_probs")
    return actor_loss(log_probs, mb["old_log_probs"], mb["advantages"], loss_mask(mb), cfg, entropy=entropy,
                      ref_log_probs=None if ref is None else ref.to(log_probs.device))


def critic_value_loss(values: torch.Tensor, entropy: torch.Tensor | None, mb: Batch,
                      value_clip: float | None) -> tuple[torch.Tensor, dict]:
    """The critic objective of :func:`roll.algorithms.losses.value_loss` (token mean) on one micro-batch:
    ``values`` (B, L-1) from the critic, old values ``mb["values"]``, targets ``mb["returns"]``."""
    return value_loss(values, mb["values"].to(values.device), mb["returns"].to(values.device), loss_mask(mb),
                      value_clip=value_clip, loss_agg_mode="token-mean")
