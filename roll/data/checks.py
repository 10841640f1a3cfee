"""Strict batch validation at every hand-off between pipeline stages (off by default).

Turned on by ``strict_data_check: true`` in the config or ``ROLL_STRICT_DATA_CHECK=1`` in the environment. Each
stage that produces or consumes a :class:`~roll.data.batch.Batch` calls :func:`check_batch_if`; a violation raises
:class:`BatchCheckError` naming the stage, the key, what was expected and what was found, instead of failing many
steps later inside a loss.

Rules (B samples, L tokens; shapes and dtypes from :data:`SCHEMA`, the keys declared in ``roll/data/batch.py``):

1. every tensor and every metadata list has B entries along dim 0;
2. declared keys have their declared shape: ``(B, L)`` for ``input_ids`` and the masks, ``(B, L-1)`` for
   log-probs, values, token scores, advantages and returns (index t scores token t+1), ``(B,)`` for ``scores``;
3. declared keys have their declared dtype (long for ids and masks, float32 for the rest);
4. float tensors are finite (no NaN or inf);
5. ``attention_mask`` and ``response_mask`` hold only 0 and 1;
6. ``response_mask`` is 1 only where ``attention_mask`` is 1;
7. ``token_level_scores`` is nonzero only at a sample's last response token (index ``last - 1`` in the L-1
   layout) and equals ``scores`` there;
8. the keys a stage needs (``required``) are present.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from roll.data.batch import Batch
from roll.data.layout import last_response_index, loss_mask

ENV_VAR = "ROLL_STRICT_DATA_CHECK"


@dataclass(frozen=True)
class KeySpec:
    """Declared layout of one tensor key: dims as names ("B", "L", "L-1") and the dtype."""

    dims: tuple[str, ...]
    dtype: torch.dtype


_LONG_BL = KeySpec(("B", "L"), torch.long)
_FLOAT_BL1 = KeySpec(("B", "L-1"), torch.float32)

#: The declared tensor keys of the training batch (see ``roll/data/batch.py``); other keys only get rules 1 and 4.
SCHEMA: dict[str, KeySpec] = {
    "input_ids": _LONG_BL,
    "attention_mask": _LONG_BL,
    "response_mask": _LONG_BL,
    "scores": KeySpec(("B",), torch.float32),
    "token_level_scores": _FLOAT_BL1,
    "old_log_probs": _FLOAT_BL1,
    "ref_log_probs": _FLOAT_BL1,
    "values": _FLOAT_BL1,
    "advantages": _FLOAT_BL1,
    "returns": _FLOAT_BL1,
}

MASK_KEYS = ("attention_mask", "response_mask")


class BatchCheckError(ValueError):
    """A batch broke a rule at a hand-off: names the stage, the key, the expected and the actual value."""

    def __init__(self, stage: str, key: str, expected: str, actual: str, hint: str = ""):
        self.stage, self.key, self.expected, self.actual = stage, key, expected, actual
        msg = (
            f"strict data check failed after stage {stage!r}: key {key!r} expected {expected}, got {actual}"
            + (f". {hint}" if hint else "")
            + f" (the check is on because strict_data_check=true or {ENV_VAR}=1)"
        )
        super().__init__(msg)


def strict_enabled(flag: bool = False) -> bool:
    """True when the config flag is set or ``ROLL_STRICT_DATA_CHECK`` is 1/true/yes/on."""
    return bool(flag) or os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def check_batch_if(enabled: bool, batch: Batch, stage: str, required: Iterable[str] = ()) -> None:
    """:func:`check_batch` when :func:`strict_enabled` (``enabled`` is the config's ``strict_data_check``)."""
    if strict_enabled(enabled):
        check_batch(batch, stage, required)


def check_batch(batch: Batch, stage: str, required: Iterable[str] = ()) -> None:
    """Apply every rule of the module docstring to ``batch``; raise :class:`BatchCheckError` on the first
    violation. ``stage`` names the step that produced the batch (it appears in the error)."""
    for key in required:
        if key not in batch:
            raise BatchCheckError(
                stage, key, "to be present", "no such key", f"present keys: {sorted(batch.iter_keys())}"
            )
    n = _batch_size(batch)
    _check_first_dims(batch, stage, n)
    length = _seq_len(batch)
    for key, value in batch.tensors.items():
        spec = SCHEMA.get(key)
        if spec is not None:
            _check_shape_dtype(stage, key, value, spec, n, length)
        if value.is_floating_point() and not _all_finite(value):
            bad = (~torch.isfinite(value)).nonzero()[0].tolist()
            raise BatchCheckError(stage, key, "finite values", f"{value[tuple(bad)].item()} at index {tuple(bad)}")
    _check_masks(batch, stage)
    _check_token_scores(batch, stage)


def _all_finite(value: torch.Tensor) -> bool:
    """No NaN/inf; the sum is the fast path (NaN and inf propagate), the elementwise test settles overflow."""
    return bool(torch.isfinite(value.sum())) or bool(torch.isfinite(value).all())


def _batch_size(batch: Batch) -> int:
    if "input_ids" in batch.tensors:
        return int(batch.tensors["input_ids"].shape[0])
    return len(batch)


def _seq_len(batch: Batch) -> int | None:
    """L from ``input_ids`` (or a mask when there are no ids); None when the batch has no (B, L) key."""
    for key in ("input_ids", *MASK_KEYS):
        value = batch.tensors.get(key)
        if value is not None and value.dim() == 2:
            return int(value.shape[1])
    return None


def _check_first_dims(batch: Batch, stage: str, n: int) -> None:
    for key, value in batch.tensors.items():
        if value.dim() == 0 or value.shape[0] != n:
            raise BatchCheckError(stage, key, f"batch size B={n} (dim 0)", f"shape {tuple(value.shape)}")
    for key, items in batch.meta.items():
        if len(items) != n:
            raise BatchCheckError(stage, key, f"a list of B={n} entries", f"{len(items)} entries")


def _check_shape_dtype(stage: str, key: str, value: torch.Tensor, spec: KeySpec, n: int, length: int | None) -> None:
    sizes = {"B": n, "L": length, "L-1": None if length is None else length - 1}
    expected = tuple(sizes[d] for d in spec.dims)
    actual = tuple(value.shape)
    if len(actual) != len(expected) or any(e is not None and e != a for e, a in zip(expected, actual)):
        named = ", ".join(f"{d}={sizes[d]}" for d in spec.dims)
        hint = "log-prob-aligned keys have L-1 columns (index t scores token t+1)" if "L-1" in spec.dims else ""
        raise BatchCheckError(stage, key, f"shape ({named})", f"shape {actual}", hint)
    if value.dtype != spec.dtype:
        raise BatchCheckError(stage, key, f"dtype {spec.dtype}", f"dtype {value.dtype}")


def _check_masks(batch: Batch, stage: str) -> None:
    for key in MASK_KEYS:
        mask = batch.tensors.get(key)
        if mask is None or mask.numel() == 0 or (int(mask.min()) >= 0 and int(mask.max()) <= 1):
            continue
        at = tuple(((mask != 0) & (mask != 1)).nonzero()[0].tolist())
        raise BatchCheckError(stage, key, "values in {0, 1}", f"{mask[at].item()} at index {at}")
    attn, resp = batch.tensors.get("attention_mask"), batch.tensors.get("response_mask")
    if attn is not None and resp is not None and bool((resp > attn).any()):  # both are 0/1 here
        at = tuple((resp > attn).nonzero()[0].tolist())
        raise BatchCheckError(stage, "response_mask", "1 only where attention_mask is 1", f"1 on padding at index {at}")


def _check_token_scores(batch: Batch, stage: str) -> None:
    tls, resp = batch.tensors.get("token_level_scores"), batch.tensors.get("response_mask")
    if tls is None or resp is None or tls.shape != (resp.shape[0], resp.shape[1] - 1):
        return
    last = last_response_index(loss_mask(resp))  # in the L-1 layout; -1 without response tokens
    nonzero = tls != 0
    rows = torch.arange(tls.shape[0])
    at_last = nonzero[rows, last.clamp(min=0)] & (last >= 0)
    bad = nonzero.sum(dim=1) > at_last.long()  # a nonzero somewhere other than the last response token
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        t = int(((tls[i] != 0) & (torch.arange(tls.shape[1]) != last[i])).nonzero()[0])
        where = f"index {int(last[i])}" if last[i] >= 0 else "nowhere (the sample has no response tokens)"
        raise BatchCheckError(
            stage,
            "token_level_scores",
            f"nonzero only at the last response token ({where}) of sample {i}",
            f"{tls[i, t].item()} at index {t}",
            "scores go at the last response token, shifted by one like the log-probs",
        )
    scores = batch.tensors.get("scores")
    if scores is None or scores.shape != tls.shape[:1]:
        return
    has = last >= 0
    placed = tls[has, last[has]]
    if not torch.allclose(placed, scores[has].to(placed.dtype)):
        i = int(has.nonzero()[(placed - scores[has]).abs().argmax()])
        raise BatchCheckError(
            stage,
            "token_level_scores",
            f"scores[{i}]={scores[i].item()} at the last response token (index {int(last[i])})",
            f"{tls[i, last[i]].item()}",
        )
