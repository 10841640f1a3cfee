"""Fused GPU kernels for training and scoring models: Liger's Triton kernels (``model_args.use_liger_kernel``).

A 0.5B model's training step is dominated by small elementwise kernels and their launches (RMSNorm's fp32 casts,
SwiGLU, RoPE: about half of the GPU time measured in ``docs/verified.md``), not by its GEMMs. Liger
(``pip install liger-kernel``) replaces those modules with one fused Triton kernel each, forward and backward.
Only the decoder's RMSNorm, SwiGLU MLP and rotary embedding are swapped; the LM head stays roll's own chunked
log-prob pass (:mod:`roll.models.logprobs`), which also yields the entropy. Generation engines (SGLang) have their
own kernels and are not touched.
"""

from __future__ import annotations

import torch

#: the Liger kernels applied; the fused cross-entropy ones are off (roll's log-prob pass owns the LM head)
LIGER_OPTIONS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def apply_liger(model: torch.nn.Module) -> torch.nn.Module:
    """Swap ``model``'s RMSNorm, SwiGLU MLP and RoPE for Liger's kernels, in place; returns ``model``.

    Raises ``RuntimeError`` (naming ``model_args.use_liger_kernel``) without CUDA, without the ``liger-kernel``
    package, or for a model type Liger does not cover. RoPE is patched in the model's transformers module, so every
    model of that type in the process uses Liger's rotary kernel afterwards (same math)."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            "model_args.use_liger_kernel: Liger's kernels are Triton kernels and need a CUDA GPU; "
            "set use_liger_kernel: false on CPU"
        )
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as exc:
        raise RuntimeError(
            f"model_args.use_liger_kernel: the liger-kernel package is not importable ({exc}); "
            f"pip install liger-kernel, or set use_liger_kernel: false"
        ) from None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise RuntimeError(
            f"model_args.use_liger_kernel: Liger has no kernels for model type {model_type!r}; "
            f"it covers: {', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}"
        )
    import inspect

    accepted = inspect.signature(apply).parameters
    apply(model=model, **{k: v for k, v in LIGER_OPTIONS.items() if k in accepted})
    return model
