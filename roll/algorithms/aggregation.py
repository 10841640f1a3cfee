"""Loss aggregation modes: how a (B, T) per-token loss matrix becomes one scalar (one registry).

Sequence-level modes average over the rows that hold at least one masked token; rows that are pure padding do not
count. An all-zero mask gives a loss of 0.

Each mode averages over a unit, its ``unit`` attribute: ``"tokens"`` (``token-mean``) or ``"sequences"`` (the
``seq-mean-*`` modes). :func:`agg_normalizer` counts that unit in a micro-batch, so that gradient accumulation can
weight micro-batch losses into the exact loss of the whole batch (:mod:`roll.strategies.microbatch`). A registered
mode without ``unit`` counts sequences.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from roll.algorithms.masking import masked_mean, masked_sum
from roll.registry import Registry


class AggFn(Protocol):
    """Signature of an aggregation mode: ``(loss_mat (B,T), mask (B,T), norm_len) -> scalar``."""

    def __call__(self, loss_mat: Tensor, mask: Tensor, norm_len: int | None) -> Tensor: ...


AGG_MODES: Registry[AggFn] = Registry("loss aggregation mode", "register_agg_mode")
register_agg_mode = AGG_MODES.register


def _mean_over_sequences(per_seq: Tensor, mask: Tensor) -> Tensor:
    """Mean of per-sequence values (B,) over sequences with at least one masked token."""
    return masked_mean(per_seq, mask.sum(dim=-1) > 0)


@register_agg_mode("token-mean")
def token_mean(loss_mat: Tensor, mask: Tensor, norm_len: int | None = None) -> Tensor:
    """``sum_{i,t} l_it m_it / sum_{i,t} m_it``: every response token weighs the same (DAPO, Yu et al. 2025)."""
    return masked_mean(loss_mat, mask)


setattr(token_mean, "unit", "tokens")  # noqa: B010  (a function attribute the AggFn protocol does not declare)


@register_agg_mode("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: Tensor, mask: Tensor, norm_len: int | None = None) -> Tensor:
    """``mean_i sum_t l_it m_it``: each sequence's token sum, averaged over sequences."""
    return _mean_over_sequences(masked_sum(loss_mat, mask, dim=-1), mask)


@register_agg_mode("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, norm_len: int | None = None) -> Tensor:
    """``mean_i (sum_t l_it m_it / sum_t m_it)``: each sequence weighs the same (original GRPO, Shao et al. 2024)."""
    return _mean_over_sequences(masked_mean(loss_mat, mask, dim=-1), mask)


@register_agg_mode("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor, norm_len: int | None = None) -> Tensor:
    """``mean_i (sum_t l_it m_it / L)`` with a fixed L = ``norm_len`` (default T): Dr.GRPO (Liu et al. 2025,
    arXiv:2503.20783), which removes GRPO's per-sequence length normalization bias."""
    length = loss_mat.shape[-1] if norm_len is None else norm_len
    if length <= 0:
        raise ValueError(f"norm_len must be a positive length, got {norm_len}; e.g. the max response length")
    return _mean_over_sequences(masked_sum(loss_mat, mask, dim=-1) / length, mask)


def agg_normalizer(mask: Tensor, mode: str) -> float:
    """How many units mode ``mode`` averages over in ``mask`` (B, T): masked tokens (``unit = "tokens"``) or rows
    with at least one masked token (``"sequences"``, the default)."""
    if is_token_unit(mode):
        return float(mask.sum())
    return float((mask.sum(dim=-1) > 0).sum())


def is_token_unit(mode: str) -> bool:
    """Whether mode ``mode`` averages over tokens (its ``unit``), not over sequences."""
    return getattr(AGG_MODES.get(mode), "unit", "sequences") == "tokens"


def episode_token_weights(mask: Tensor, mode: str, norm_len: int | None = None) -> Tensor:
    """Per-token weights that make samples of one episode aggregate like the episode (``trajectory_mode: step``).

    For a sequence mode applied to episode rows (one row per episode, its replies side by side), ``W`` is such
    that ``agg_loss(l, mask, mode) = sum_{e,t} l_et W_et / E`` for every loss matrix ``l`` (E = rows with a masked
    token), i.e. ``W = E * d agg / d l``, read off the mode by autograd (every built-in mode is linear in ``l``).
    Split over the episode's samples, ``sum_{i,t} l_it W_it / sum_i f_i`` with ``f_i = 1 / samples of its
    episode`` (the episode fraction, summing to 1 per episode) is then the episode loss however the samples are
    spread over micro-batches. Built in: ``seq-mean-token-mean`` -> ``m_et / n_e`` (n_e = the episode's masked
    tokens); ``seq-mean-token-sum`` -> ``m_et``; ``seq-mean-token-sum-norm`` -> ``m_et / norm_len``. A
    token-unit mode (``token-mean``) needs no weights: every token is its own unit in any layout.

    Args:
        mask: (E, T) loss mask of episode rows.
        mode: a sequence-unit aggregation mode.
        norm_len: the fixed length of ``seq-mean-token-sum-norm``.
    Returns:
        (E, T) weights, 0 where ``mask`` is 0.
    """
    if is_token_unit(mode):
        raise ValueError(f"loss_agg_mode {mode!r} averages over tokens: its samples need no episode weights")
    mask = mask.float()
    with torch.enable_grad():
        loss_mat = torch.zeros_like(mask, requires_grad=True)
        (grad,) = torch.autograd.grad(AGG_MODES.get(mode)(loss_mat, mask, norm_len), loss_mat)
    return grad * (mask.sum(-1) > 0).sum() * mask


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, norm_len: int | None = None) -> Tensor:
    """Aggregate a per-token loss matrix with the registered ``mode``.

    Args:
        loss_mat: (B, T) per-token losses.
        mask: (B, T) response mask.
        mode: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm``.
        norm_len: the fixed length L of ``seq-mean-token-sum-norm`` (default T); ignored by the other modes.
    Returns:
        A scalar tensor.
    """
    if loss_mat.dim() != 2 or loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must both be (B, T)")
    return AGG_MODES.get(mode)(loss_mat, mask, norm_len)
