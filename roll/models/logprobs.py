"""Token log-probs (and entropy) of a causal LM without materializing the full ``(B, T, V)`` logits.

The model runs once to its final hidden states (captured from its decoder; the LM head is asked for one position
only, ``logits_to_keep=1``). The head is then applied chunk by chunk over the scored tokens: ``logits ->
log_softmax -> gather (+ entropy)`` in one fused autograd function (:class:`LinearLogProbs`, whose backward
recomputes the chunk's logits), or checkpointed through the head module where the head is not a plain linear layer
in this process (a ZeRO-3 shard); forward and backward hold the logits of one chunk at a time. Chunks have at most :data:`CHUNK_ELEMENTS` logits (``chunk = CHUNK_ELEMENTS //
vocab`` tokens: 1,766 tokens of a 151,936-word vocabulary, i.e. 1 GiB of fp32 logits).

Packed mode (``pack=True``) removes padding: the real tokens of all samples are concatenated into one row whose
position ids restart at 0 for every sample; transformers then masks attention block-diagonally (each token sees
only its own sample; flash-attention varlen where installed). Results are scattered back to the padded layout.

Output frame (both modes): index ``t`` of row ``i`` holds ``log p(input_ids[i, t+1] | input_ids[i, :t+1])``, i.e.
``(B, L) -> (B, L-1)``; positions whose predicted token is padding hold 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

#: Logit elements per chunk of the LM-head pass (2**28 fp32 = 1 GiB).
CHUNK_ELEMENTS = 2 ** 28


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


def _head_chunk(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label) and entropy of one chunk: hidden (n, H), labels (n,) -> (n,), (n,) (entropy 0 when off)."""
    logits = head(hidden).float()  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)  # (n,)
    log_probs = logits.gather(-1, labels[:, None]).squeeze(-1) - log_z
    if not with_entropy:
        return log_probs, torch.zeros_like(log_probs)
    entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # H = logsumexp(z) - E_p[z]
    return log_probs, entropy


class LinearLogProbs(torch.autograd.Function):
    """``log softmax(h W^T / t)[label]`` and the entropy of one chunk, fused: the forward keeps only ``h``, the
    labels and the log-normalizer; the backward recomputes the chunk's logits for the gradients.

    Gradients (z = logits, p = softmax(z), H = entropy): ``d lp / dz = onehot(label) - p``;
    ``d H / dz = -p (z - logsumexp(z) + H)``; then ``dh = dz W / t`` and ``dW = dz^T h / t``.
    Shapes: hidden (n, H), weight (V, H), labels (n,) -> log_probs (n,), entropy (n,) (zeros when off)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float, with_entropy: bool):
        logits = (hidden @ weight.t()).float()
        if temperature != 1.0:
            logits.div_(temperature)
        log_z = torch.logsumexp(logits, dim=-1)
        log_probs = logits.gather(-1, labels[:, None]).squeeze(-1) - log_z
        entropy = torch.zeros_like(log_probs)
        if with_entropy:
            entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)
        ctx.save_for_backward(hidden, weight, labels, log_z, entropy)
        ctx.temperature, ctx.with_entropy = temperature, with_entropy
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, labels, log_z, entropy = ctx.saved_tensors
        t = ctx.temperature
        logits = (hidden @ weight.t()).float()
        if t != 1.0:
            logits.div_(t)
        logits.sub_(log_z[:, None])  # log p
        probs = logits.exp()
        grad = probs * -(grad_lp if grad_lp is not None else torch.zeros_like(log_z))[:, None]
        if grad_lp is not None:
            grad.scatter_add_(1, labels[:, None], grad_lp[:, None])
        if ctx.with_entropy and grad_ent is not None:
            grad.sub_(probs.mul_(logits.add_(entropy[:, None])).mul_(grad_ent[:, None]))
        if t != 1.0:
            grad.div_(t)
        grad = grad.to(hidden.dtype)
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None


def _fusable(head: torch.nn.Module) -> bool:
    """A bias-free linear head whose full weight is in this process (not a ZeRO-3 shard, which only the module's
    own forward gathers)."""
    weight = getattr(head, "weight", None)
    return (isinstance(head, torch.nn.Linear) and head.bias is None and weight is not None
            and not hasattr(weight, "ds_id"))


def head_log_probs(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                   with_entropy: bool = False, chunk_tokens: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(head(hidden) / temperature)[labels]`` and the entropy, chunk by chunk: (n, H), (n,) -> (n,).

    Under autograd each chunk runs :class:`LinearLogProbs` (a bias-free linear head), or else is checkpointed
    through the head module: either way no chunk's logits are kept for the backward."""
    vocab = getattr(head, "out_features", None) or head.weight.shape[0]
    chunk = chunk_tokens or max(1, CHUNK_ELEMENTS // int(vocab))
    lps, ents = [], []
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    fused = grad and _fusable(head)
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start:start + chunk], labels[start:start + chunk]
        if fused:
            lp, ent = LinearLogProbs.apply(h, head.weight, y, temperature, with_entropy)
        elif grad:
            lp, ent = checkpoint(_head_chunk, head, h, y, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _head_chunk(head, h, y, temperature, with_entropy)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def final_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                        position_ids: torch.Tensor) -> torch.Tensor:
    """The decoder's output (after its final norm), (B, L, H), from a forward through ``model`` itself (so that
    wrappers such as a DeepSpeed engine see the call) with the LM head applied to one position only."""
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    decoder = module.get_decoder()
    captured: list[torch.Tensor] = []

    def keep(_mod, _args, output):
        captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = decoder.register_forward_hook(keep)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
              logits_to_keep=1)
    finally:
        handle.remove()
    return captured[-1]


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row's real tokens form a prefix (no padding before or between them)."""
    ones = attention_mask.long().sum(-1, keepdim=True)
    prefix = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < ones
    return bool((attention_mask.bool() == prefix).all())


def _padded_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor) -> torch.Tensor:
    """Final hidden states of a padded batch. Right-padded rows run without a mask (plain causal attention, the
    fused kernels' fast path): a real token only sees earlier tokens, which are all real, so its output is the
    masked forward's; only the padding positions' outputs differ, and nothing reads them. Other layouts (left
    padding) pass the mask, with positions counted over real tokens."""
    if is_right_padded(attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return final_hidden_states(model, input_ids, None, positions)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return final_hidden_states(model, input_ids, attention_mask, positions)


def token_log_probs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                    with_entropy: bool = False, temperature: float = 1.0, pack: bool = False,
                    chunk_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]): (B, L) -> log_probs (B, L-1) float32 [, entropy (B, L-1)].

    ``pack``: run the real tokens as one packed row (no padding; see the module docstring). Padded mode counts
    positions over real tokens only, so left and right padding both work. Positions whose predicted token is padding
    are 0 in both outputs.
    """
    module = getattr(model, "module", model)
    head = module.get_output_embeddings()
    batch, length = input_ids.shape
    out = torch.zeros(batch, length - 1, device=input_ids.device, dtype=torch.float32)
    ent = torch.zeros_like(out) if with_entropy else None
    if pack:
        layout = pack_layout(attention_mask)
        flat_ids = input_ids.flatten()[layout.index]  # (N,)
        hidden = final_hidden_states(model, flat_ids[None], None, layout.position_ids.to(input_ids.device))[0]
        src = layout.scored.nonzero().flatten()  # packed token j predicts packed token j + 1
        lp, e = head_log_probs(head, hidden[src], flat_ids[src + 1], temperature=temperature,
                               with_entropy=with_entropy, chunk_tokens=chunk_tokens)
        rows = torch.div(layout.index[src], length, rounding_mode="floor")
        cols = layout.index[src] - rows * length
        dest = rows * (length - 1) + cols  # same (row, position) in the (B, L-1) frame
    else:
        hidden = _padded_hidden_states(model, input_ids, attention_mask)[:, :-1]  # (B, L-1, H)
        scored = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
        dest = scored.flatten().nonzero().flatten()
        lp, e = head_log_probs(head, hidden.reshape(-1, hidden.shape[-1])[dest], input_ids[:, 1:].flatten()[dest],
                               temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens)
    out = out.flatten().index_put((dest,), lp).view(batch, length - 1)
    if with_entropy:
        ent = ent.flatten().index_put((dest,), e).view(batch, length - 1)
    return out, ent
