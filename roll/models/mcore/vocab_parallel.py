"""Token log-probs and entropy from vocabulary-parallel logits (each tensor-parallel rank holds a vocab slice).

Pure torch + ``torch.distributed`` (no megatron import). With ``group=None`` (TP = 1) it is plain log-softmax.
Sums over the ranks pass gradients through unchanged (as megatron's ``reduce_from_tensor_model_parallel_region``),
so a loss on these log-probs or entropies trains the sharded output layer correctly.

For rank r holding logits ``z[..., v]`` of vocab ids ``[start_r, start_r + V_r)``:
``m = max_all(z)`` (no gradient: a constant shift), ``Z = sum_all exp(z - m)``, ``log p(t) = z_t - m - log Z``
(``z_t`` summed from the one rank holding ``t``), ``H = m + log Z - sum_all(exp(z - m) * z) / Z``.
"""

from __future__ import annotations

import torch


class _AllReduceSum(torch.autograd.Function):
    """Sum over the TP ranks; the gradient passes through unchanged. Every rank computes the same loss from the
    replicated sum, so each rank's share of the gradient is exactly the sum's gradient (``torch.distributed.nn``'s
    all-reduce would sum the identical gradients again, TP times too large)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        import torch.distributed as dist

        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _sum(x: torch.Tensor, group) -> torch.Tensor:
    """All-reduce sum over ``group`` (gradient: identity); no-op without a group."""
    return x if group is None else _AllReduceSum.apply(x, group)


def vocab_parallel_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0, group=None, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(targets)`` and the entropy of softmax over the full vocabulary.

    Args:
        logits: (B, T, V_r) this rank's vocab slice, any float dtype (computed in float32).
        targets: (B, T) token ids in the full vocabulary.
        vocab_start: first vocab id of this rank's slice.
        group: the tensor-parallel process group, or None when one rank holds the whole vocabulary.
    Returns:
        log_probs (B, T) float32, entropy (B, T) float32 or None.
    """
    z = logits.float()
    m = z.detach().amax(dim=-1)  # (B, T)
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shifted = z - m.unsqueeze(-1)
    exp = shifted.exp()
    log_z = _sum(exp.sum(-1), group).log()  # (B, T)
    local = targets - vocab_start
    inside = (local >= 0) & (local < z.shape[-1])
    picked = torch.gather(shifted, -1, local.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    target_shifted = _sum(torch.where(inside, picked, torch.zeros_like(picked)), group)  # z_t - m
    log_probs = target_shifted - log_z
    entropy = None
    if with_entropy:
        expected = _sum((exp * shifted).sum(-1), group) / log_z.exp()  # E_p[z - m]
        entropy = log_z - expected
    return log_probs, entropy
