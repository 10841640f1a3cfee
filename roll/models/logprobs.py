"""Token log-probs (and entropy) of a causal LM without materializing the full ``(B, T, V)`` logits.

The model runs once to its final hidden states (captured from its decoder; the LM head is asked for one position
only, ``logits_to_keep=1``). The head is then applied chunk by chunk over the scored tokens: ``logits ->
log_softmax -> gather (+ entropy)`` in one fused autograd function (:class:`LinearLogProbs`, whose backward
recomputes the chunk's logits), or checkpointed through the head module where the head is not a plain linear layer
in this process (a ZeRO-3 shard, an FSDP2 DTensor shard); forward and backward hold the logits of one chunk at a
time: :data:`CHUNK_ELEMENTS` logits (1,766 tokens of a 151,936-word vocabulary). Compiled on CUDA (``compiled=True``,
``model_args.compile_log_probs``), a chunk's log-softmax / entropy math runs as fused kernels; eager (CPU, or
compilation off) it runs in place.

Packed mode (``pack=True``) removes padding: the real tokens of all samples are concatenated into one row whose
position ids restart at 0 for every sample; transformers then masks attention block-diagonally (each token sees
only its own sample; flash-attention varlen where installed). Results are scattered back to the padded layout.

Shared-prefix mode (``share_prefix=True``): the samples that begin with the same tokens run as one row, the prefix
once (:mod:`roll.models.prefix_sharing`); a position of the shared prefix is scored once and copied to its samples.

Images (a vision-language model, ``vision``: ``pixel_values`` and ``image_grid_thw`` from
:func:`roll.models.vision.vision_kwargs`): the padded forward with the mask, the images and the model's 3-D rotary
positions (:func:`roll.models.vision.rope_positions`); packing and shared prefixes are refused (their 1-D positions
restart per segment, which 3-D positions of images do not).

Output frame (every mode): index ``t`` of row ``i`` holds ``log p(input_ids[i, t+1] | input_ids[i, :t+1])``, i.e.
``(B, L) -> (B, L-1)``; positions whose predicted token is padding hold 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from roll.models.prefix_sharing import pair_cost, shared_prefix_layout

#: Logit elements per chunk of the LM-head pass (2**28: 0.5 GiB of bf16 logits; eager, each of the three fp32
#: temporaries is 1 GiB).
CHUNK_ELEMENTS = 2**28


@dataclass(frozen=True)
class PackedLayout:
    """Where each sample's real tokens sit in the packed row.

    ``index`` (N,): flat index ``i * L + p`` in the padded ``(B, L)`` layout of packed token ``j``;
    ``position_ids`` (1, N): position of each packed token within its own sample (restarts at 0);
    ``scored`` (N,): True where the next packed token belongs to the same sample (packed token j predicts j+1).
    """

    index: torch.Tensor
    position_ids: torch.Tensor
    scored: torch.Tensor


def pack_layout(attention_mask: torch.Tensor) -> PackedLayout:
    """The :class:`PackedLayout` of a ``(B, L)`` 0/1 mask (real tokens of a row need not be contiguous)."""
    mask = attention_mask.bool()
    index = mask.flatten().nonzero().flatten()  # (N,)
    positions = (mask.long().cumsum(-1) - 1)[mask]  # (N,): 0.. per sample
    rows = torch.div(index, mask.shape[1], rounding_mode="floor")
    scored = torch.zeros_like(rows, dtype=torch.bool)
    scored[:-1] = rows[1:] == rows[:-1]
    return PackedLayout(index=index, position_ids=positions[None], scored=scored)


def logit_stats(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's ``log p(label)``, ``log Z`` and entropy (zeros when off), float32: logits (n, V) in any float
    dtype, labels (n,) -> three (n,). ``H = log Z - E_p[z]``."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    log_z = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, labels[:, None]).squeeze(-1) - log_z
    entropy = log_z - (torch.softmax(z, dim=-1) * z).sum(-1) if with_entropy else torch.zeros_like(log_z)
    return log_probs, log_z, entropy


def logit_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    log_z: torch.Tensor,
    entropy: torch.Tensor,
    grad_lp: torch.Tensor,
    grad_ent: torch.Tensor | None,
    temperature: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Gradient of ``sum(grad_lp * log p(label) + grad_ent * H)`` with respect to one chunk's logits (n, V), in
    ``out_dtype``: ``d lp / dz = (onehot(label) - p) / t`` and ``d H / dz = -p (log p + H) / t``."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    log_p = z - log_z[:, None]
    p = log_p.exp()
    onehot = torch.arange(z.shape[-1], device=z.device)[None] == labels[:, None]
    grad = (onehot.float() - p) * grad_lp[:, None]
    if grad_ent is not None:
        grad = grad - p * (log_p + entropy[:, None]) * grad_ent[:, None]
    if temperature != 1.0:
        grad = grad / temperature
    return grad.to(out_dtype)


def _logit_grad_eager(
    logits: torch.Tensor,
    labels: torch.Tensor,
    log_z: torch.Tensor,
    entropy: torch.Tensor,
    grad_lp: torch.Tensor,
    grad_ent: torch.Tensor | None,
    temperature: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """:func:`logit_grad` in place, for eager PyTorch: three fp32 temporaries of the chunk's size instead of about
    six, and the same operations in the same order as roll's earlier releases (fixed-seed CPU runs stay bit for
    bit the same). ``logits`` may be overwritten."""
    z = logits.float()
    if temperature != 1.0:
        z.div_(temperature)
    z.sub_(log_z[:, None])  # log p
    probs = z.exp()
    grad = probs * -grad_lp[:, None]
    grad.scatter_add_(1, labels[:, None], grad_lp[:, None])
    if grad_ent is not None:
        grad.sub_(probs.mul_(z.add_(entropy[:, None])).mul_(grad_ent[:, None]))
    if temperature != 1.0:
        grad.div_(temperature)
    return grad.to(out_dtype)


_COMPILED: dict[str, Callable] = {}


def _kernels(device: torch.device, compiled: bool) -> tuple[Callable, Callable]:
    """``(logit_stats, gradient function)``: eager (:func:`logit_stats`, :func:`_logit_grad_eager`), or, for
    ``compiled`` on CUDA, :func:`logit_stats` and :func:`logit_grad` compiled once per process by ``torch.compile``
    into fused kernels (no fp32 copy of a chunk's logits is materialized)."""
    if not compiled or device.type != "cuda":
        return logit_stats, _logit_grad_eager
    if not _COMPILED:
        _COMPILED["stats"] = torch.compile(logit_stats, dynamic=True)
        _COMPILED["grad"] = torch.compile(logit_grad, dynamic=True)
    return _COMPILED["stats"], _COMPILED["grad"]


def _head_chunk(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label) and entropy of one chunk: hidden (n, H), labels (n,) -> (n,), (n,) (entropy 0 when off)."""
    stats, _ = _kernels(hidden.device, compiled)
    log_probs, _, entropy = stats(head(hidden), labels, temperature, with_entropy)
    return log_probs, entropy


class LinearLogProbs(torch.autograd.Function):
    """``log softmax(h W^T / t)[label]`` and the entropy of one chunk, fused: the forward keeps only ``h``, the
    labels and the log-normalizer; the backward recomputes the chunk's logits for the gradients
    (:func:`logit_grad`), then ``dh = dz W`` and ``dW = dz^T h``. ``compiled``: :func:`_kernels`.
    Shapes: hidden (n, H), weight (V, H), labels (n,) -> log_probs (n,), entropy (n,) (zeros when off)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float, with_entropy: bool, compiled: bool = False):
        stats, _ = _kernels(hidden.device, compiled)
        log_probs, log_z, entropy = stats(hidden @ weight.t(), labels, temperature, with_entropy)
        ctx.save_for_backward(hidden, weight, labels, log_z, entropy)
        ctx.temperature, ctx.with_entropy, ctx.compiled = temperature, with_entropy, compiled
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, labels, log_z, entropy = ctx.saved_tensors
        _, grad_fn = _kernels(hidden.device, ctx.compiled)
        if grad_lp is None:
            grad_lp = torch.zeros_like(log_z)
        grad = grad_fn(
            hidden @ weight.t(),
            labels,
            log_z,
            entropy,
            grad_lp,
            grad_ent if ctx.with_entropy else None,
            ctx.temperature,
            hidden.dtype,
        )
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None


def _fusable(head: torch.nn.Module) -> bool:
    """A bias-free linear head whose full weight is a plain tensor in this process: not a ZeRO-3 shard or an FSDP2
    DTensor shard (a head sharded as its own unit), which only the module's own forward gathers."""
    weight = getattr(head, "weight", None)
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and weight is not None
        and not hasattr(weight, "ds_id")
        and not _is_dtensor(weight)
    )


def _frozen_zero3(head: torch.nn.Module) -> bool:
    """A head whose weight is a frozen ZeRO-3 shard (a LoRA run's). Its chunks are checkpointed reentrantly:
    DeepSpeed keeps a frozen weight gathered for a recompute only inside a backward it sees (the reentrant
    checkpoint's); non-reentrant, the recompute's weight is released before its backward reads it."""
    weight = getattr(head, "weight", None)
    return weight is not None and hasattr(weight, "ds_id") and not weight.requires_grad


def _is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (a sharded parameter of FSDP2), without importing DTensor for plain ones."""
    if type(tensor) in (torch.Tensor, torch.nn.Parameter):
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def head_log_probs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(head(hidden) / temperature)[labels]`` and the entropy, chunk by chunk: (n, H), (n,) -> (n,).

    Under autograd each chunk runs :class:`LinearLogProbs` (a bias-free linear head), or else is checkpointed
    through the head module: either way no chunk's logits are kept for the backward. ``compiled``: the chunk's
    log-softmax / entropy math runs as compiled kernels on CUDA (:func:`_kernels`)."""
    vocab = getattr(head, "out_features", None) or head.weight.shape[0]
    chunk = chunk_tokens or max(1, CHUNK_ELEMENTS // int(vocab))
    lps, ents = [], []
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    fused = grad and _fusable(head)
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start : start + chunk], labels[start : start + chunk]
        if fused:
            lp, ent = LinearLogProbs.apply(h, head.weight, y, temperature, with_entropy, compiled)
        elif grad:
            reentrant = _frozen_zero3(head)
            lp, ent = checkpoint(_head_chunk, head, h, y, temperature, with_entropy, compiled, use_reentrant=reentrant)
        else:
            lp, ent = _head_chunk(head, h, y, temperature, with_entropy, compiled)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def final_hidden_states(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    **images: torch.Tensor,
) -> torch.Tensor:
    """The decoder's output (after its final norm), (B, L, H), from a forward through ``model`` itself (so that
    wrappers such as a DeepSpeed engine see the call) with the LM head applied to one position only (``images``:
    a vision-language model's ``pixel_values`` and ``image_grid_thw``)."""
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    decoder = module.get_decoder()
    captured: list[torch.Tensor] = []

    def keep(_mod, _args, output):
        captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = decoder.register_forward_hook(keep)
    try:
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=1,
            **images,
        )
    finally:
        handle.remove()
    return captured[-1]


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row's real tokens form a prefix (no padding before or between them)."""
    ones = attention_mask.long().sum(-1, keepdim=True)
    prefix = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < ones
    return bool((attention_mask.bool() == prefix).all())


def _padded_hidden_states(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Final hidden states of a padded batch. Right-padded rows run without a mask (plain causal attention, the
    fused kernels' fast path): a real token only sees earlier tokens, which are all real, so its output is the
    masked forward's; only the padding positions' outputs differ, and nothing reads them. Other layouts (left
    padding) pass the mask, with positions counted over real tokens."""
    if is_right_padded(attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return final_hidden_states(model, input_ids, None, positions)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return final_hidden_states(model, input_ids, attention_mask, positions)


def token_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    pack: bool = False,
    share_prefix: bool = False,
    chunk_tokens: int | None = None,
    compiled: bool = False,
    vision: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]): (B, L) -> log_probs (B, L-1) float32 [, entropy (B, L-1)].

    ``vision``: the images of a vision-language model's batch (``pixel_values`` (P, D), ``image_grid_thw`` (K, 3));
    the padded forward with 3-D positions (``pack`` / ``share_prefix`` raise ValueError).

    ``pack``: run the real tokens as one packed row (no padding; see the module docstring). ``share_prefix``: run
    the samples that begin with the same tokens as shared-prefix rows (:mod:`roll.models.prefix_sharing`; the padded
    forward where a row's real tokens are not contiguous). Padded mode counts positions over real tokens only, so
    left and right padding both work. Positions whose predicted token is padding are 0 in every mode.
    """
    module = getattr(model, "module", model)
    head = module.get_output_embeddings()
    batch, length = input_ids.shape
    out = torch.zeros(batch, length - 1, device=input_ids.device, dtype=torch.float32)
    ent = torch.zeros_like(out) if with_entropy else None
    shared, padded = None, None
    if share_prefix and not vision:
        hidden_size = getattr(getattr(module, "config", None), "hidden_size", None) or 1024
        shared = shared_prefix_layout(input_ids, attention_mask, pair_cost(hidden_size))
    if vision:
        if pack or share_prefix:
            raise ValueError(
                "token_log_probs: a batch with images runs padded (3-D rotary positions); turn off "
                "use_sequence_packing and use_prefix_sharing for a vision-language actor"
            )
        from roll.models.vision import rope_positions

        positions = rope_positions(model, input_ids, attention_mask, vision["image_grid_thw"])
        padded = final_hidden_states(model, input_ids, attention_mask, positions, **vision)
    elif shared is not None:
        device = input_ids.device
        mask = shared.additive_mask(module.get_input_embeddings().weight.dtype).to(device)
        hidden = final_hidden_states(model, shared.input_ids.to(device), mask, shared.position_ids.to(device))
        hidden = hidden.reshape(-1, hidden.shape[-1])
        lp, e = head_log_probs(
            head,
            hidden[shared.src.to(device)],
            shared.labels.to(device),
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
            compiled=compiled,
        )
        pick = shared.pick.to(device)
        lp, e = lp[pick], (e[pick] if with_entropy else None)
        dest = shared.dest.to(device)
    elif pack:
        layout = pack_layout(attention_mask)
        flat_ids = input_ids.flatten()[layout.index]  # (N,)
        hidden = final_hidden_states(model, flat_ids[None], None, layout.position_ids.to(input_ids.device))[0]
        src = layout.scored.nonzero().flatten()  # packed token j predicts packed token j + 1
        lp, e = head_log_probs(
            head,
            hidden[src],
            flat_ids[src + 1],
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
            compiled=compiled,
        )
        rows = torch.div(layout.index[src], length, rounding_mode="floor")
        cols = layout.index[src] - rows * length
        dest = rows * (length - 1) + cols  # same (row, position) in the (B, L-1) frame
    else:
        padded = _padded_hidden_states(model, input_ids, attention_mask)
    if padded is not None:  # a padded forward's (B, L, H) hidden states: score the real tokens
        hidden = padded[:, :-1]  # (B, L-1, H)
        scored = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
        dest = scored.flatten().nonzero().flatten()
        lp, e = head_log_probs(
            head,
            hidden.reshape(-1, hidden.shape[-1])[dest],
            input_ids[:, 1:].flatten()[dest],
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
            compiled=compiled,
        )
    out = out.flatten().index_put((dest,), lp).view(batch, length - 1)
    if with_entropy:
        ent = ent.flatten().index_put((dest,), e).view(batch, length - 1)
    return out, ent
