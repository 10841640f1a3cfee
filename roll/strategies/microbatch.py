"""Micro-batches of a training (or log-prob) batch, and the weights that make gradient accumulation exact.

Forming micro-batches:

- fixed (default): consecutive chunks of ``per_device_train_batch_size`` samples;
- dynamic (``use_dynamic_batching_in_train`` / ``_in_infer``, ROLL's names): samples grouped by a token budget
  ``max_tokens_per_microbatch_in_*``, first-fit decreasing by length. A micro-batch costs the sum of its samples'
  lengths when packed (``use_sequence_packing``), else ``samples x longest`` (what the padded forward computes). A
  sample longer than the budget gets a micro-batch of its own.

Every micro-batch is trimmed to its longest sample (right padding removed), whatever the mode.

Exact accumulation: a loss function returns the mean of its micro-batch over some unit (tokens for ``token-mean``,
sequences for the ``seq-mean-*`` modes: :func:`roll.algorithms.aggregation.agg_normalizer`). Weighting micro-batch
``k`` by ``w_k = n_k / sum_j n_j`` (``n`` = its count of that unit) makes ``sum_k w_k loss_k`` the loss of the whole
batch, so the gradient does not depend on how the batch was cut into micro-batches (fixed or dynamic, padded or
packed). Metrics are averaged with the same weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from roll.data.batch import Batch


def sample_lengths(batch: Batch) -> list[int]:
    """Real tokens of each sample: ``attention_mask.sum(-1)``."""
    return [int(n) for n in batch["attention_mask"].sum(-1).tolist()]


def plan_by_tokens(lengths: list[int], max_tokens: int, packed: bool) -> list[list[int]]:
    """Sample indices grouped under a token budget, first-fit decreasing (see the module docstring).

    >>> plan_by_tokens([5, 3, 4, 2], 8, packed=True)
    [[0, 1], [2, 3]]
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_microbatch={max_tokens}: must be >= 1")
    bins: list[list[int]] = []
    used: list[int] = []  # packed: tokens; padded: samples x longest (the longest is the bin's first sample)
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for b, members in enumerate(bins):
            cost = used[b] + lengths[i] if packed else (len(members) + 1) * lengths[members[0]]
            if cost <= max_tokens:
                members.append(i)
                used[b] = cost
                break
        else:
            bins.append([i])
            used.append(lengths[i])
    return [sorted(b) for b in bins]


def trim_right(batch: Batch) -> Batch:
    """``batch`` without the padding columns past its longest sample: tensors of width L (token frame) keep
    ``width`` columns, tensors of width L-1 (log-prob frame) keep ``width - 1``."""
    mask = batch["attention_mask"]
    full = mask.shape[1]
    real = mask.any(0).nonzero()
    width = int(real[-1]) + 1 if len(real) else 1
    if width == full:
        return batch
    tensors = {}
    for key, value in batch.tensors.items():
        if value.dim() >= 2 and value.shape[1] == full:
            value = value[:, :width]
        elif value.dim() >= 2 and value.shape[1] == full - 1:
            value = value[:, : max(width - 1, 0)]
        tensors[key] = value
    return Batch(tensors, dict(batch.meta), dict(batch.info))


def micro_batches(
    batch: Batch, samples: int, max_tokens: int | None = None, packed: bool = False
) -> list[tuple[list[int], Batch]]:
    """``(sample indices, trimmed micro-batch)`` pairs covering ``batch``: fixed chunks of ``samples``, or, with
    ``max_tokens``, a token-budget plan (:func:`plan_by_tokens`)."""
    n = len(batch)
    if max_tokens:
        plan = plan_by_tokens(sample_lengths(batch), max_tokens, packed)
    else:
        plan = [list(range(i, min(i + samples, n))) for i in range(0, n, samples)]
    return [(idx, trim_right(batch.select(idx))) for idx in plan]


def accumulation_weights(parts: list[Batch], normalizer: Callable[[Batch], float] | None) -> list[float]:
    """``w_k = n_k / sum_j n_j`` with ``n_k = normalizer(part_k)`` (samples when ``normalizer`` is None, or when
    every count is 0)."""
    counts = [float(normalizer(p)) if normalizer is not None else float(len(p)) for p in parts]
    total = sum(counts)
    if total <= 0:
        counts, total = [float(len(p)) for p in parts], float(sum(len(p) for p in parts))
    return [c / total for c in counts]


def scatter_rows(parts: list[tuple[list[int], torch.Tensor]], batch_size: int, width: int) -> torch.Tensor:
    """Reassemble per-micro-batch ``(indices, (b, w_k))`` results into one ``(batch_size, width)`` tensor (columns
    past a micro-batch's trimmed width stay 0)."""
    first = parts[0][1]
    out = first.new_zeros(batch_size, width)
    for idx, values in parts:
        out[torch.as_tensor(idx, dtype=torch.long), : values.shape[1]] = values
    return out
