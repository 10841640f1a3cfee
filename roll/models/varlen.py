"""Padding-free attention on GPUs without the flash-attn package: PyTorch's flash varlen kernel
(``torch.nn.attention.varlen.varlen_attn``) behind transformers' attention interface, as ``attn_implementation =
"roll_varlen"``.

Each sequence attends causally to itself only. Sequences are found, per forward, from (in this order): a 2D padding
mask (each row's real tokens; padding is dropped before the kernel and zeros are put back after), the position ids
of a packed row (a sequence starts wherever the position restarts at 0: :func:`roll.models.logprobs.token_log_probs`
with ``pack=True``), or else every row is one sequence. So a packed micro-batch costs ``sum_i L_i^2`` attention, not
``(sum_i L_i)^2`` as SDPA with a block-diagonal mask would. Training and scoring only (no KV cache: generation keeps
its own implementation). Needs CUDA, bf16/fp16 and a PyTorch with ``varlen_attn`` (2.10+).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

NAME = "roll_varlen"


def available() -> bool:
    """Whether this process can run the kernel: CUDA and ``torch.nn.attention.varlen``."""
    if not torch.cuda.is_available():
        return False
    import importlib.util

    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def register() -> str:
    """Register ``roll_varlen`` with transformers (idempotent); returns the name to pass as attn_implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)  # None, or the 2D padding mask
    return NAME


def _kernel_options() -> dict[str, Any]:
    """Causality and GQA keywords of this PyTorch's ``varlen_attn`` (2.10: ``is_causal``; later: ``window_size``)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    options: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "enable_gqa" in params:
        options["enable_gqa"] = True
    return options


_CACHE: dict[str, Any] = {}  # the sequence layout of the current forward (computed once, used by every layer)


def sequence_layout(
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    batch: int,
    length: int,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """``(index of the real tokens in the flattened (B*T) layout or None, cumulative lengths (N+1,) int32, longest)``
    (see the module docstring for how sequences are found)."""
    key = (id(attention_mask), id(position_ids), batch, length)
    if _CACHE.get("key") == key:
        return _CACHE["value"]
    if attention_mask is not None and attention_mask.dim() == 2:
        lengths = attention_mask.sum(-1, dtype=torch.int32)
        index = attention_mask.flatten().nonzero().flatten()
    elif batch == 1 and position_ids is not None:
        starts = (position_ids.reshape(-1) == 0).nonzero().flatten()
        bounds = torch.cat([starts, torch.tensor([length], device=starts.device)])
        lengths, index = (bounds[1:] - bounds[:-1]).to(torch.int32), None
        if len(starts) == 0 or int(starts[0]) != 0:
            raise ValueError("roll_varlen: a packed row must start a sequence at position 0")
    else:
        lengths, index = torch.full((batch,), length, dtype=torch.int32, device=device), None
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    cu[1:] = lengths.to(device).cumsum(0)
    value = (index, cu, int(lengths.max()))
    _CACHE.update(key=key, value=value, refs=(attention_mask, position_ids))  # keep ids valid while cached
    return value


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: query (B, Hq, T, D), key/value (B, Hkv, T, D) -> (B, T, Hq, D)."""
    from torch.nn.attention.varlen import varlen_attn

    batch, heads, length, dim = query.shape
    if key.shape[2] != length:
        raise ValueError(
            f"roll_varlen: {key.shape[2]} keys for {length} queries; it serves training and scoring "
            f"passes without a KV cache (generate with sdpa)"
        )
    if dropout:
        raise ValueError("roll_varlen: attention dropout is not supported (RL training uses none)")
    options = _kernel_options()
    groups = heads // key.shape[1]
    if groups > 1 and "enable_gqa" not in options:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    q, k, v = (t.transpose(1, 2).reshape(batch * length, t.shape[1], dim) for t in (query, key, value))
    index, cu, longest = sequence_layout(attention_mask, kwargs.get("position_ids"), batch, length, query.device)
    if index is not None:
        q, k, v = q[index], k[index], v[index]
    out = varlen_attn(q, k, v, cu, cu, longest, longest, scale=scaling, **options)
    if index is not None:
        full = out.new_zeros(batch * length, heads, dim)
        full[index] = out
        out = full
    return out.view(batch, length, heads, dim), None
