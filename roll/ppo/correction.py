"""The train-inference correction: importance weights and masks for samples made by other weights."""

from __future__ import annotations

import torch

from roll.algorithms.offpolicy import importance_weights, prob_diff_band_mask, ratio_band_mask
from roll.config.base import TrainInferCorrectionConfig
from roll.data.batch import Batch
from roll.ppo.loss_fns import loss_mask


# ---------------------------------------------------------------------------- score normalization
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
