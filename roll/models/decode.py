"""A lean decode loop for Llama-family decoders (Qwen2, Llama): the same weights and the same sampling as
transformers' ``generate``, in 0.69-0.95x of its time per call for a small model on CPU (``benchmarks/decode_speed.py``;
the prefill is the same forward on both paths, so long replies gain most).

``generate`` spends much of a small model's decode step outside the arithmetic: a mask and position tensors
rebuilt every token, a cache that grows by concatenation, logits processors and stopping criteria. Here the model
runs the prefill as usual (one forward with ``use_cache``); its keys and values are copied into a buffer sized for
the whole reply, and every later token runs each layer's own modules and weights through a fixed list of tensor
ops (no module dispatch beyond the norms, the rotary embedding and the activation). Sampling repeats
``generate``'s order (minimum new tokens, temperature, top-k, top-p, then one ``torch.multinomial`` draw from the
global generator), and the log-prob of a token is taken under the distribution it was drawn from, by the same
``compute_transition_scores(normalize_logits=True)`` call. The logits are ``generate``'s bit for bit, so the tokens,
log-probs and keys are too: ``tests/models/test_decode.py`` holds it to that, greedy and sampled, with left padding,
stop tokens and a prefix cache.

Models of another family, sliding-window attention, or a repetition penalty: :func:`unsupported` names the
reason, and ``hf_infer`` falls back to ``generate``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

#: ``config.model_type`` values whose decoder layer is exactly: norm, attention (q/k/v/o projections, rotary),
#: residual, norm, gated MLP (``down(act(gate(x)) * up(x))``), residual.
LEAN_MODEL_TYPES = ("qwen2", "llama")


def unsupported(model: Any, repetition_penalty: float = 1.0) -> str | None:
    """Why :func:`decode` cannot run ``model`` (None when it can)."""
    if hasattr(model, "peft_config"):
        return "a peft model (its adapter layers run in the modules' forward, which the loop does not call)"
    config = model.config
    if config.model_type not in LEAN_MODEL_TYPES:
        return f"model type {config.model_type!r} (supported: {', '.join(LEAN_MODEL_TYPES)})"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return f"attn_implementation {config._attn_implementation!r}"
    if repetition_penalty != 1.0:
        return f"repetition_penalty {repetition_penalty}"
    return None


@dataclass
class Decoded:
    """``tokens`` and ``log_probs``: (B, n) for the n decode steps taken (every row past its stop token holds the
    pad id); ``cache`` (None unless asked for): a ``DynamicCache`` over the prompt width plus n - 1 positions (the
    last token is never fed back), laid out as ``generate``'s ``past_key_values``."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    cache: Any


def _process(
    scores: torch.Tensor,
    step: int,
    *,
    min_new_tokens: int,
    stop_ids: Sequence[int],
    sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
) -> torch.Tensor:
    """``generate``'s logits processors and warpers, in its order, on float32 scores (B, V)."""
    if step < min_new_tokens:
        scores[:, list(stop_ids)] = float("-inf")
    if not sample:
        return scores
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]))[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        drop = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop[..., -1:] = False  # keep at least one token
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores


def _layer_step(
    layer: Any,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    col: int,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """One decoder layer for one new token per row: ``x`` (B, hidden) at buffer column ``col``; ``mask`` (B, 1, 1,
    columns), True where attended, or None where every column is. The attention call is the one ``generate`` makes
    (its SDPA path), so that the logits agree bit for bit."""
    attn, mlp = layer.self_attn, layer.mlp
    batch, dim = x.shape[0], attn.head_dim
    h = layer.input_layernorm(x)
    q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(batch, -1, dim)
    k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(batch, -1, dim)
    keys[:, :, col] = k * cos + torch.cat((-k[..., dim // 2 :], k[..., : dim // 2]), -1) * sin
    values[:, :, col] = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(batch, -1, dim)
    q = q * cos + torch.cat((-q[..., dim // 2 :], q[..., : dim // 2]), -1) * sin
    keys, values = keys[:, :, : col + 1], values[:, :, : col + 1]
    if mask is None:  # no padding: generate passes no mask, and grouped heads to SDPA
        o = F.scaled_dot_product_attention(
            q[:, :, None], keys, values, scale=attn.scaling, enable_gqa=q.shape[1] != keys.shape[1]
        )
    else:  # query heads grouped by their key/value head, as generate's pack_gqa
        o = F.scaled_dot_product_attention(
            q.view(batch, keys.shape[1], -1, dim), keys, values, attn_mask=mask[..., : col + 1], scale=attn.scaling
        )
    x = x + F.linear(o.reshape(batch, -1), attn.o_proj.weight, attn.o_proj.bias)
    h = layer.post_attention_layernorm(x)
    gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
    up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
    return x + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)


@functools.cache
def cache_arg(model_cls: type) -> str:
    """The forward's keyword for a key/value cache: ``cache`` (transformers 5.x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model_cls.forward).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """The key/value cache a forward or ``generate`` returned: ``out.cache`` (transformers 5.x, where reading
    ``past_key_values`` prints a deprecation warning) or ``out.past_key_values`` (older versions)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.no_grad()
def decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    *,
    past: Any = None,
    past_width: int = 0,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_new_tokens: int = 0,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    keep_cache: bool = True,
) -> Decoded:
    """Up to ``max_new_tokens`` tokens per row after left-padded ``input_ids`` (B, W) whose first ``past_width``
    columns already have keys and values in ``past`` (a ``DynamicCache``); stops early once every row has produced
    a stop id. Arguments mean what ``generate``'s do; ``keep_cache=False`` returns no cache."""
    from transformers import DynamicCache

    if max_new_tokens < 1:
        raise ValueError(f"decode: max_new_tokens must be >= 1, got {max_new_tokens}")
    inner = model.model
    batch, width = input_ids.shape
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids[:, past_width:],
        attention_mask=attention_mask,
        use_cache=True,
        logits_to_keep=1,
        position_ids=positions[:, past_width:],
        **{cache_arg(type(model)): past},
    )
    buffers = []
    for layer in output_cache(out).layers:
        k = layer.keys.new_zeros((batch, layer.keys.shape[1], width + max_new_tokens, layer.keys.shape[-1]))
        v = torch.zeros_like(k)
        k[:, :, :width], v[:, :, :width] = layer.keys, layer.values
        buffers.append((k, v))
    mask = None
    if not bool(attention_mask.all()):
        mask = torch.ones((batch, 1, 1, width + max_new_tokens), dtype=torch.bool, device=input_ids.device)
        mask[:, 0, 0, :width] = attention_mask.bool()
    # every decode step's rotary cos/sin in one call: (B, N, head_dim) each
    steps = positions[:, -1:] + 1 + torch.arange(max_new_tokens, device=input_ids.device)
    rotary = inner.rotary_emb(buffers[0][0], steps)  # in the model's dtype, as generate's
    sampling = dict(
        min_new_tokens=min_new_tokens,
        stop_ids=stop_ids,
        sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=input_ids.device)
    unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
    logits = out.logits[:, -1, :].to(dtype=torch.float32)
    tokens, processed = [], []
    for step in range(max_new_tokens):
        scores = _process(logits.clone(), step, **sampling)
        if do_sample:
            token = torch.multinomial(scores.softmax(dim=-1), num_samples=1).squeeze(1)
        else:
            token = scores.argmax(dim=-1)
        token = torch.where(unfinished, token, pad_id)
        tokens.append(token)
        processed.append(scores)
        unfinished &= ~torch.isin(token, stop)
        if step == max_new_tokens - 1 or not bool(unfinished.any()):
            break
        col = width + step
        x = inner.embed_tokens(token)
        cos, sin = rotary[0][:, step : step + 1], rotary[1][:, step : step + 1]  # (B, 1, head_dim): over the heads
        for layer, (keys, values) in zip(inner.layers, buffers):
            x = _layer_step(layer, x, cos, sin, keys, values, col, mask)
        logits = model.lm_head(inner.norm(x)).to(dtype=torch.float32)
    used = width + len(tokens) - 1
    cache = DynamicCache([(k[:, :, :used], v[:, :, :used]) for k, v in buffers]) if keep_cache else None
    new = torch.stack(tokens, 1)
    # generate's own computation over all steps at once (a per-step log_softmax differs in the last bit)
    log_probs = model.compute_transition_scores(torch.cat([input_ids, new], 1), tuple(processed), normalize_logits=True)
    return Decoded(new, log_probs, cache)
