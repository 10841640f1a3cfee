"""Learning-rate schedule of the training strategies (the optimizer's rate is set before every step)."""

from __future__ import annotations

import math


def lr_at(step: int, peak: float, warmup: int, total: int, kind: str) -> float:
    """Learning rate after ``step`` optimizer steps: linear warmup, then constant / linear / cosine decay."""
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    if kind == "constant" or total <= warmup:
        return peak
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (1 - frac) if kind == "linear" else peak * 0.5 * (1 + math.cos(math.pi * frac))
