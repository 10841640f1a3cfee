"""Plot training curves from a ``metrics.jsonl`` written by any tracker.

Command line::

    python -m roll.tracking.plot output/logs/metrics.jsonl                # -> output/logs/metrics.png
    python -m roll.tracking.plot output/logs/metrics.jsonl -o curves.png --keys rollout/success_rate "val/*"

Keys are shell-style patterns (``val/*``). The figure is drawn with matplotlib's Agg canvas directly (no pyplot,
no global backend change), so it works on headless machines and inside a notebook session alike.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

#: Default panels: patterns, in panel order; those that match nothing are left out.
DEFAULT_PLOT_KEYS: tuple[str, ...] = (
    "rollout/success_rate",
    "rollout/mean_reward",
    "val/*",
    "actor/pg_loss",
    "time/step",
)
RECORD_FIELDS = ("step", "timestamp")


def load_metrics(metrics_jsonl: str) -> pd.DataFrame:
    """Read ``metrics.jsonl`` into a DataFrame: index = step (sorted), one float column per metric key.

    Records of the same step are merged in file order, later values winning: a step logged in several calls
    becomes one row, and a step logged again after a resume keeps the resumed run's values. ``null`` becomes NaN.
    Unparsable lines (e.g. a last line cut off by a crash) are skipped with a warning.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    merged: dict[int, dict[str, Any]] = {}
    with open(metrics_jsonl, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                warnings.warn(f"{metrics_jsonl}:{lineno}: skipping a line that is not a metrics record", stacklevel=2)
                continue
            row = merged.setdefault(step, {})
            row.update({k: (math.nan if v is None else v) for k, v in record.items() if k not in RECORD_FIELDS})
    frame = pd.DataFrame.from_dict(merged, orient="index", dtype=float).sort_index()
    frame.index.name = "step"
    return frame


def select_keys(available: Sequence[str], patterns: Sequence[str], *, strict: bool) -> list[str]:
    """Keys of ``available`` matching ``patterns`` (shell-style), in pattern order, each once.

    Within one pattern the matches are sorted. With ``strict`` a pattern that matches nothing is an error.

    Raises:
        ValueError: ``strict`` and a pattern matches no key; the message lists the available keys.
    """
    chosen: list[str] = []
    for pattern in patterns:
        matches = sorted(k for k in available if fnmatch.fnmatchcase(k, pattern))
        if strict and not matches:
            raise ValueError(f"key {pattern!r} matches no metric; available keys: {sorted(available)}.")
        chosen += [k for k in matches if k not in chosen]
    return chosen


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, cols) of a grid holding ``n`` panels, at most ``max_cols`` wide."""
    cols = min(n, max_cols)
    return (n + cols - 1) // cols, cols


def plot_metrics(metrics_jsonl: str, out_png: str, keys: list[str] | None = None) -> list[str]:
    """Draw one panel per metric (value against step) and save the figure as ``out_png``.

    Args:
        metrics_jsonl: path of a ``metrics.jsonl`` written by a tracker.
        out_png: output image path (the format follows the extension); parent directories are created.
        keys: metric keys or patterns such as ``"val/*"``; ``None`` = :data:`DEFAULT_PLOT_KEYS` (those present).

    Returns:
        The metric keys plotted, in panel order.

    Raises:
        ValueError: a given key matches no metric, or (with the defaults) no default key is present.
    """
    frame = load_metrics(metrics_jsonl)
    available = list(frame.columns)
    chosen = select_keys(available, keys if keys is not None else DEFAULT_PLOT_KEYS, strict=keys is not None)
    if not chosen:
        raise ValueError(
            f"none of the default keys {list(DEFAULT_PLOT_KEYS)} is in {metrics_jsonl}; "
            f"pass keys (--keys) from: {sorted(available)}."
        )
    rows, cols = _grid(len(chosen))
    fig = Figure(figsize=(4.5 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, key in zip(axes, chosen):
        series = frame[key].dropna()
        ax.plot(series.index, series.to_numpy(), marker="o" if len(series) <= 50 else None, markersize=3)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    fig.suptitle(metrics_jsonl, fontsize=10)
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 2 bad input)."""
    parser = argparse.ArgumentParser(
        prog="python -m roll.tracking.plot", description="Plot training curves from a tracker's metrics.jsonl."
    )
    parser.add_argument("metrics_jsonl", help="path of metrics.jsonl (in the run's logging_dir)")
    parser.add_argument("-o", "--out", help="output image (default: metrics.png next to the input)")
    parser.add_argument("--keys", nargs="+", help="metric keys or patterns such as 'val/*' (default: headline keys)")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(os.path.dirname(args.metrics_jsonl), "metrics.png")
    try:
        plotted = plot_metrics(args.metrics_jsonl, out, args.keys)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(plotted)} panels: {', '.join(plotted)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
