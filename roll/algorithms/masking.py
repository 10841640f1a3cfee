"""Masked reductions over token tensors.

Masks are 0/1 tensors (bool, int or float) of the same shape as the data. Positions where the mask is 0 never
influence a result, even when they hold ``nan`` or ``inf`` (padding may contain anything). A float mask of
non-negative weights makes :func:`masked_sum` and :func:`masked_mean` weighted (``sum x m``, ``sum x m / sum m``):
the per-episode loss weights of step-wise samples (:func:`roll.algorithms.aggregation.episode_token_weights`).
"""

from __future__ import annotations

import torch
from torch import Tensor

WHITEN_EPS = 1e-8


def _masked_zero(x: Tensor, mask: Tensor, weighted: bool = False) -> Tensor:
    """Return ``x`` with masked-out positions set to exactly 0 (also when they hold nan/inf); ``weighted``: ``x``
    times a float mask's weights elsewhere (exactly ``x`` where the weight is 1)."""
    if x.shape != mask.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal data shape {tuple(x.shape)}; pass the matching mask"
        )
    if weighted and mask.is_floating_point():
        x = x * mask.to(x.dtype)
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over positions where ``mask`` is nonzero: ``sum_i x_i * m_i``.

    Args:
        x: data, any shape, e.g. (B, T).
        mask: same shape as ``x``.
        dim: dimension to reduce; ``None`` reduces all dimensions to a scalar.
    """
    xm = _masked_zero(x, mask, weighted=True)
    return xm.sum() if dim is None else xm.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1: ``sum_i x_i m_i / sum_i m_i``.

    An empty mask (sum 0) gives 0 instead of nan.

    Args:
        x: data, any shape, e.g. (B, T).
        mask: same shape as ``x``.
        dim: dimension to reduce (e.g. ``-1`` gives a per-sequence mean of shape (B,)); ``None`` gives a scalar.
    """
    total = masked_sum(x, mask, dim)
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim=dim)
    return torch.where(count > 0, total / count.clamp(min=1e-12), torch.zeros_like(total))


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all positions where ``mask`` is 1 (a scalar).

    Formula: ``v = sum_i m_i (x_i - mean)^2 / n``, times ``n / (n - 1)`` when ``unbiased`` (Bessel's correction),
    with ``n = sum_i m_i``. Fewer than 2 masked positions give variance 0 (nothing to spread).

    Args:
        x: data, any shape, e.g. (B, T).
        mask: same shape as ``x``.
        unbiased: sample variance (``n - 1``) if True, population variance (``n``) if False.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    n = mask.to(x.dtype).sum()
    if n < 2:
        return torch.zeros_like(var)
    return var * n / (n - 1) if unbiased else var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """Standardize ``x`` with the mean and (unbiased) variance of its masked positions.

    Formula: ``w = (x - mean) / sqrt(var + 1e-8)``; with ``shift_mean=False`` the mean is added back,
    ``w = (x - mean) / sqrt(var + 1e-8) + mean`` (only the scale changes). Positions where the mask is 0 are 0.

    Args:
        x: data, any shape, e.g. (B, T).
        mask: same shape as ``x``.
        shift_mean: whether the result has mean 0 (True) or keeps the mean of ``x`` (False).
    Returns:
        Tensor of the shape of ``x``.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return _masked_zero(whitened, mask)
