"""Model and tokenizer loading (the token log-prob pass is :func:`roll.models.logprobs.token_log_probs`)."""

from __future__ import annotations

from typing import Any

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


def is_vision_config(config: object) -> bool:
    """Whether a model config is a vision-language one (it has a ``vision_config``; :mod:`roll.models.vision`)."""
    return getattr(config, "vision_config", None) is not None


def auto_model_class(config: object) -> type[Any]:
    """transformers' auto class that builds a model of ``config``: ``AutoModelForImageTextToText`` for a
    vision-language config (:func:`is_vision_config`), else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def scoring_attention(attn_implementation: str | None, dtype: str, packed: bool) -> str | None:
    """The attention implementation of a training/scoring model: the configured one, else, for packed rows on a
    GPU in bf16/fp16, ``roll_varlen`` (:mod:`roll.models.varlen`: padding-free without flash-attn), else None
    (transformers' default, SDPA: packed rows then use a block-diagonal mask)."""
    if attn_implementation or not packed or dtype == "fp32":
        return attn_implementation
    from roll.models import varlen

    return varlen.register() if varlen.available() else None


def load_causal_lm(
    path: str,
    dtype: str = "fp32",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    use_liger_kernel: bool = False,
) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` with roll's dtype names (``AutoModelForImageTextToText`` for a
    vision-language config, e.g. Qwen2.5-VL: :mod:`roll.models.vision`); ``use_liger_kernel``: with Liger's fused
    kernels (:func:`roll.models.kernels.apply_liger`)."""
    from transformers import AutoConfig

    kwargs = {"dtype": DTYPES[dtype], "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    auto = auto_model_class(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
    model = auto.from_pretrained(path, **kwargs)
    if use_liger_kernel:
        from roll.models.kernels import apply_liger

        apply_liger(model)
    return model
