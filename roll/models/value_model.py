"""The critic's model: a causal LM's transformer with a scalar value head, and its per-token value pass.

The value model is ``AutoModelForTokenClassification`` with ``num_labels=1`` built from the same checkpoint as the
policy (any architecture transformers maps to a token-classification head, e.g. Qwen2, Llama, Mistral). A head the
checkpoint lacks (a policy checkpoint) starts at zero, so every initial value is 0; a saved critic keeps its head.
"""

from __future__ import annotations

import torch

from roll.models.loading import DTYPES


def load_value_model(
    path: str, dtype: str = "fp32", attn_implementation: str | None = None, trust_remote_code: bool = False
) -> torch.nn.Module:
    """The value model of ``path``: backbone weights from the checkpoint, head ``hidden -> 1`` (zero when new).

    Dropout before the head is off (``classifier_dropout=0``): a value target must not be noisy.
    """
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path, num_labels=1, trust_remote_code=trust_remote_code)
    config.classifier_dropout = 0.0  # read by the token-classification head in place of its default 0.1
    kwargs = {
        "config": config,
        "dtype": DTYPES[dtype],
        "trust_remote_code": trust_remote_code,
        "output_loading_info": True,
    }
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model, info = AutoModelForTokenClassification.from_pretrained(path, **kwargs)
    missing = set(info.get("missing_keys", ()))
    params = dict(model.named_parameters())
    backbone_missing = [n for n in missing if n in params and not n.startswith(_head_prefix(model))]
    if backbone_missing:
        raise ValueError(
            f"critic: {path} lacks backbone weights {sorted(backbone_missing)[:3]}...; point the "
            "critic's model_name_or_path at a checkpoint of the policy's architecture"
        )
    with torch.no_grad():
        for name in missing:
            if name in params:
                params[name].zero_()
    return model


def _head_prefix(model: torch.nn.Module) -> str:
    """Name prefix of the value head (the parameters outside the base model), e.g. ``"score"``."""
    base = getattr(model, "base_model_prefix", "model")
    heads = {n.split(".", 1)[0] for n, _ in model.named_parameters() if not n.startswith(base + ".")}
    if len(heads) != 1:
        raise ValueError(f"critic: expected one value head outside '{base}', found {sorted(heads)}")
    return heads.pop()


def sequence_values(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Per-position values aligned with the log-probs: (B, L) -> (B, L-1) float32.

    ``values[:, t] = V(input_ids[:, :t+1])``, the value of the state in which token ``t+1`` is chosen, so index t
    matches ``log_probs[:, t] = log p(input_ids[:, t+1] | input_ids[:, :t+1])``. Positions count real tokens only.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.logits[:, :-1, 0].float()  # (B, L-1): head output at the last token of each prefix
