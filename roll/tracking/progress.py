"""A training progress bar (tqdm) that shows a few headline metrics; off when stdout is not a terminal.

Use::

    with progress(total=cfg.max_steps, desc="train", initial=start_step) as bar:
        for step in range(start_step, cfg.max_steps):
            metrics = ...
            tracker.log(metrics, step)
            bar.advance(metrics)

In a terminal the bar sits below the tracker's per-step lines (they are printed with ``tqdm.write``). When stdout
is redirected to a file or pipe the bar is disabled and the per-step lines are the whole progress report.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO

from tqdm import tqdm

from roll.tracking.base import DEFAULT_HEADLINE_KEYS
from roll.tracking.stdout import format_value


def short_names(keys: Iterable[str]) -> dict[str, str]:
    """Display names for postfix keys: the part after the last ``/`` unless two keys share it.

    ``["rollout/success_rate", "actor/pg_loss"]`` ->
    ``{"rollout/success_rate": "success_rate", "actor/pg_loss": "pg_loss"}``;
    ``rollout/success_rate`` and ``val/success_rate`` together keep their full names.
    """
    keys = list(keys)
    tails = [k.rsplit("/", 1)[-1] for k in keys]
    return {k: (t if tails.count(t) == 1 else k) for k, t in zip(keys, tails)}


class Progress:
    """Handle returned by :func:`progress`; advance it once per training step.

    Args:
        bar: the tqdm bar (possibly disabled).
        postfix_keys: metric keys shown after the bar, in this order, when present.
    """

    def __init__(self, bar: tqdm, postfix_keys: Iterable[str]) -> None:
        self.bar = bar
        self.postfix_keys = list(postfix_keys)

    @property
    def enabled(self) -> bool:
        """Whether the bar is drawn."""
        return not self.bar.disable

    def postfix(self, metrics: Mapping[str, float]) -> str:
        """The postfix text for ``metrics``: ``"success_rate=0.3125, pg_loss=0.012"`` (present keys only)."""
        present = [k for k in self.postfix_keys if k in metrics]
        names = short_names(present)
        return ", ".join(f"{names[k]}={format_value(float(metrics[k]))}" for k in present)

    def advance(self, metrics: Mapping[str, float] | None = None, n: int = 1) -> None:
        """Move the bar ``n`` steps and, if given, show the postfix of ``metrics``."""
        if metrics is not None and self.enabled:
            self.bar.set_postfix_str(self.postfix(metrics), refresh=False)
        self.bar.update(n)


@contextmanager
def progress(
    total: int,
    desc: str = "train",
    *,
    initial: int = 0,
    postfix_keys: Iterable[str] = DEFAULT_HEADLINE_KEYS,
    enabled: bool | None = None,
    file: IO[str] | None = None,
) -> Iterator[Progress]:
    """Context manager yielding a :class:`Progress` bar over ``total`` steps.

    Args:
        total: number of steps of the whole run.
        desc: label in front of the bar.
        initial: steps already done (a resumed run starts the bar there).
        postfix_keys: metrics shown after the bar, those present, in this order.
        enabled: force the bar on or off; ``None`` = on only when ``file`` is a terminal.
        file: where the bar is drawn; default ``sys.stdout``.
    """
    out = file or sys.stdout
    if enabled is None:
        enabled = bool(getattr(out, "isatty", lambda: False)())
    bar = tqdm(total=total, desc=desc, initial=initial, file=out, disable=not enabled, dynamic_ncols=True)
    try:
        yield Progress(bar, postfix_keys)
    finally:
        bar.close()
