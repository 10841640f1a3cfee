"""Model and tokenizer loading, and the token log-prob forward pass shared by all torch backends."""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_tokenizer(path: str):
    """The tokenizer at ``path``, left-padded for generation, with a pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: str = "fp32", attn_implementation: str | None = None,
                   trust_remote_code: bool = False) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` with roll's dtype names."""
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": DTYPES[dtype], "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: (B, T, V) -> (B, T)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def sequence_log_probs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       with_entropy: bool = False, temperature: float = 1.0
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) for t < L-1: (B, L) -> log_probs (B, L-1), entropy (B, L-1).

    Samples are right-padded; positions count real tokens only so left padding also works.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits[:, :-1]  # (B, L-1, V): prediction of the next token
    if temperature != 1.0:
        logits = logits / temperature
    logits = logits.float()
    log_probs = torch.gather(torch.log_softmax(logits, -1), 2, input_ids[:, 1:, None]).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs, entropy
