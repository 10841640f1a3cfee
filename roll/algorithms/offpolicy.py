"""Off-policy correction between the policy that sampled the tokens and the one the loss compares against.

Tokens are sampled by the inference engine (the *behaviour* policy, log-probs ``behaviour`` = the engine's
``rollout_log_probs``); the PPO ratio is taken against the *proximal* policy, the trainer's own log-probs of the
same weights (``old_log_probs``, recomputed). The two differ by kernels and precision (train/inference mismatch)
and, in asynchronous training, by policy versions. Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for
policy optimization"; AReaL) keeps the clipped ratio against the proximal policy and weights each token's loss by
the stop-gradient importance weight ``w = pi_prox / pi_behav``, truncated (TIS, Yao et al. 2025) and optionally
masked where the ratio leaves a band (rejection, Liu & Li et al. 2025). For a weight ``w >= 0`` the weighted PPO
loss ``w * max(-A r, -A clip(r))`` equals the PPO loss with advantages ``w * A``, which is how the pipeline applies
it.

Granularities (``agg``), each a (B, T) tensor constant where it aggregates; ``d = proximal - behaviour`` on masked
tokens:

- ``token``: ``exp(d_t)``;
- ``segment``: ``exp(mean of d over the contiguous masked span containing t)`` (one span per turn);
- ``geometric``: ``exp(mean of d over the sample's masked tokens)``;
- ``sequence``: ``exp(sum of d over the sample's masked tokens)``.

ROLL's keys (``train_infer_correction.is_weight`` / ``.filters``) map one to one; see ``docs/algorithms.md``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from roll.algorithms.masking import masked_mean

AGGREGATIONS = ("token", "segment", "geometric", "sequence")


def _segment_ids(mask: Tensor) -> Tensor:
    """(B, T) mask -> (B, T) span ids: contiguous runs of 1 numbered 1, 2, ... across the batch, 0 elsewhere."""
    m = mask.bool()
    starts = m & ~torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)  # a 1 after a 0 (or at t = 0)
    ids = torch.cumsum(starts.flatten().long(), 0).view_as(mask)
    return ids * m


def aggregate(values: Tensor, mask: Tensor, agg: str) -> Tensor:
    """``values`` aggregated at granularity ``agg`` over masked tokens: ``token`` itself, ``segment`` the mean over
    its contiguous masked span, ``geometric`` the mean over the sample, ``sequence`` the sum over the sample;
    (B, T), (B, T) -> (B, T), 0 off the mask."""
    m = mask.to(values.dtype)
    v = values * m
    if agg == "token":
        out = v
    elif agg == "sequence":
        out = v.sum(-1, keepdim=True).expand_as(v)
    elif agg == "geometric":
        out = masked_mean(values, mask, dim=-1).unsqueeze(-1).expand_as(v)
    elif agg == "segment":
        ids = _segment_ids(mask).flatten()
        n = int(ids.max()) + 1
        sums = torch.zeros(n, dtype=v.dtype).index_add_(0, ids, v.flatten())
        counts = torch.zeros(n, dtype=v.dtype).index_add_(0, ids, m.flatten())
        out = (sums / counts.clamp(min=1))[ids].view_as(v)
    else:
        raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got {agg!r}")
    return out * m


@torch.no_grad()
def importance_weights(
    proximal: Tensor, behaviour: Tensor, mask: Tensor, weight_type: str = "token", upper_bound: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance weights ``w = min(exp(agg(proximal - behaviour)), upper_bound)`` (detached).

    Args:
        proximal: (B, T) the trainer's log-probs of the sampled tokens (``old_log_probs``).
        behaviour: (B, T) the sampler's log-probs (``rollout_log_probs``).
        mask: (B, T) 1 on tokens with both (response tokens the engine generated).
        weight_type: the granularity (``token``, ``segment``, ``geometric``, ``sequence``).
        upper_bound: truncation (``None``: none).
    Returns:
        ``w`` (B, T), 1 off the mask, and ``actor/is_weight_mean`` (before truncation, masked mean),
        ``actor/is_weight_truncated_frac`` (masked fraction above the bound).
    """
    log_w = aggregate(proximal.float() - behaviour.float(), mask, weight_type)
    raw = torch.exp(log_w)
    truncated = raw > upper_bound if upper_bound is not None else torch.zeros_like(raw, dtype=torch.bool)
    w = raw.clamp(max=upper_bound) if upper_bound is not None else raw
    w = torch.where(mask.bool(), w, torch.ones_like(w))
    return w, {
        "actor/is_weight_mean": float(masked_mean(raw, mask)),
        "actor/is_weight_truncated_frac": float(masked_mean(truncated.float(), mask)),
    }


@torch.no_grad()
def ratio_band_mask(proximal: Tensor, behaviour: Tensor, mask: Tensor, agg: str, low: float, high: float) -> Tensor:
    """1 where ``low <= exp(agg(proximal - behaviour)) <= high``, else 0 (1 off the mask): (B, T) -> (B, T)."""
    return _in_band(torch.exp(aggregate(proximal.float() - behaviour.float(), mask, agg)), mask, low, high)


@torch.no_grad()
def prob_diff_band_mask(proximal: Tensor, behaviour: Tensor, mask: Tensor, agg: str, low: float, high: float) -> Tensor:
    """1 where the probability difference ``p_prox - p_behav`` (token; mean over the span / sample for
    ``segment`` / ``geometric``; sum over the sample for ``sequence``) is in ``[low, high]``; 1 off the mask."""
    return _in_band(aggregate(proximal.float().exp() - behaviour.float().exp(), mask, agg), mask, low, high)


def _in_band(values: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """1.0 where ``low <= values <= high`` or off the mask, else 0.0."""
    return ((values >= low) & (values <= high) | ~mask.bool()).float()
