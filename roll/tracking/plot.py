"""Plot training curves from a ``metrics.jsonl`` written by any tracker.

Command line::

    python -m roll.tracking.plot output/logs/metrics.jsonl                # the dashboard -> output/logs/metrics.png
    python -m roll.tracking.plot output/logs/metrics.jsonl -o curves.png --keys rollout/success_rate "val/*"

Without keys the figure is a dashboard (:data:`DASHBOARD`): success (training, smoothed, with validation points on
top, and the levels to beat as horizontal lines: the step-0 validation, the warm start's level, and the same-time
SFT control's final validation when ``benchmarks/rl_vs_sft.py`` ran one beside the run, :func:`reference_levels`),
reward, invalid actions, episode length, entropy, approximate KL, the step time stacked by phase and the run-health
alerts (which rule fired at which steps, :mod:`roll.tracking.health`; every line panel also marks those steps on its
step axis). Panels whose metrics a run does not log are absent; panels whose series never change are left out and
their series named in a note under the figure. With keys (shell-style patterns such as ``val/*``) there is one panel
per key. The figure is drawn with
matplotlib's Agg canvas directly (no pyplot, no global backend change), so it works on headless machines and inside
a notebook session alike.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

RECORD_FIELDS = ("step", "timestamp")
HEALTH_PREFIX, HEALTH_ALERTS = "health/", "health/alerts"  # roll.tracking.health's metrics


@dataclass(frozen=True)
class Panel:
    """One dashboard panel: a training series and its validation counterpart (the first key of each tuple that a
    run logs), with ``references`` the levels its validation series is to beat (:func:`reference_levels`); with
    ``stacked``, the step time split into the phases listed there; with ``events``, the 0/1 flag columns of that
    prefix (one row each) drawn as markers at the steps where they are 1."""

    title: str
    train: tuple[str, ...] = ()
    val: tuple[str, ...] = ()
    percent: bool = False
    stacked: tuple[tuple[str, str], ...] = ()
    references: bool = False
    events: str = ""


#: Phases of ``time/step`` (key, label), bottom to top; the rest of ``time/step`` is drawn as "other".
#: Validation (``time/val``) runs after the step and is not part of it.
STEP_PHASES: tuple[tuple[str, str], ...] = (
    ("time/rollout", "rollout"),
    ("time/offload_reload", "offload/reload"),
    ("time/old_log_probs", "old log-probs"),
    ("time/ref_log_probs", "ref log-probs"),
    ("time/log_probs", "log-probs"),
    ("time/values", "values"),
    ("time/train", "train"),
    ("time/sync", "weight sync"),
)

#: The default figure, in panel order (agentic and RLVR keys side by side: a run has one or the other).
DASHBOARD: tuple[Panel, ...] = (
    Panel(
        "success rate",
        ("rollout/success_rate", "rollout/accuracy"),
        ("val/success_rate", "val/accuracy"),
        percent=True,
        references=True,
    ),
    Panel("mean reward", ("rollout/mean_reward",), ("val/mean_reward",)),
    Panel("invalid-action rate", ("rollout/invalid_action_rate",), ("val/invalid_action_rate",), percent=True),
    Panel("format rate", ("rollout/format_rate",), ("val/format_rate",), percent=True),
    Panel("actions per episode", ("rollout/mean_actions",), ("val/mean_actions",)),
    Panel("response length (tokens)", ("rollout/response_length",), ("val/response_length",)),
    Panel("entropy", ("actor/entropy",)),
    Panel("approx KL", ("actor/approx_kl",)),
    Panel("groups filtered (dynamic sampling)", ("dynamic_sampling/groups_filtered",)),
    Panel("step time (s)", stacked=STEP_PHASES),
    Panel("run health: rules firing", events=HEALTH_PREFIX),
)

TRAIN_COLOR, VAL_COLOR, ALERT_COLOR = "#1f77b4", "#d62728", "#e4572e"
REFERENCE_COLORS = ("#555555", "#2ca02c")  # the warm start's level, the SFT control's

#: ``benchmarks/rl_vs_sft.py`` writes a seed's RL run to ``<out>/seed<N>/rl/`` and its same-time SFT control to
#: ``<out>/seed<N>/control/`` (each with ``logs/metrics.jsonl``): a run with a ``control/`` sibling is compared with
#: that control's final validation.
CONTROL_DIR = "control"


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


def is_constant(series: pd.Series) -> bool:
    """True when the series has no value or a single distinct value (NaN ignored)."""
    return series.dropna().nunique() <= 1


def smooth(series: pd.Series) -> tuple[pd.Series, int]:
    """Exponential moving average over a span of about a tenth of the points (at least 3), bias-corrected at the
    start (``adjust=True``); returns it and the span. NaN are dropped first."""
    values = series.dropna()
    span = max(3, round(len(values) / 10))
    return values.ewm(span=span, adjust=True).mean(), span


def _first(frame: pd.DataFrame, keys: Sequence[str]) -> str | None:
    return next((k for k in keys if k in frame.columns and frame[k].notna().any()), None)


def _constant_note(frame: pd.DataFrame, key: str) -> str:
    values = frame[key].dropna()
    return f"{key} = {values.iloc[0]:.4g}" if len(values) else f"{key} (no values)"


@dataclass
class PanelPlan:
    """What one panel draws: the series keys it uses, in drawing order."""

    panel: Panel
    keys: list[str]


def plan_dashboard(frame: pd.DataFrame, panels: Sequence[Panel] = DASHBOARD) -> tuple[list[PanelPlan], list[str]]:
    """Which panels to draw and what to say about the rest.

    A panel is drawn, with all its series, when at least one of them varies; otherwise its series (which never
    change) are named with their values in the returned notes. The step-time panel draws the phases that took time
    (the others are noted).
    """
    plans: list[PanelPlan] = []
    notes: list[str] = []
    for panel in panels:
        if panel.events:
            fired = fired_flags(frame, panel.events)
            if fired:
                plans.append(PanelPlan(panel, fired))
            continue
        if panel.stacked:
            present = [k for k, _ in panel.stacked if _first(frame, [k])]
            keys = [k for k in present if frame[k].max() > 0]
            notes += [_constant_note(frame, k) for k in present if k not in keys]
            if keys and "time/step" in frame.columns:
                plans.append(PanelPlan(panel, keys))
            continue
        present = [k for k in (_first(frame, panel.train), _first(frame, panel.val)) if k]
        if any(not is_constant(frame[k]) for k in present):
            plans.append(PanelPlan(panel, present))  # a flat validation line next to a moving one says something
        else:
            notes += [_constant_note(frame, k) for k in present]
    return plans, notes


def fired_flags(frame: pd.DataFrame, prefix: str = HEALTH_PREFIX) -> list[str]:
    """The flag columns of ``prefix`` (``health/<rule>``, not the ``health/alerts`` count) that are 1 at some step."""
    return [c for c in sorted(frame.columns) if c.startswith(prefix) and c != HEALTH_ALERTS and (frame[c] >= 1).any()]


def _spans(steps: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"`` (runs of consecutive logged steps)."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def health_note(frame: pd.DataFrame) -> str | None:
    """One line on the run's health: the rules that fired and at which steps, that none did, or None for a run
    without the health check (no ``health/alerts``)."""
    if HEALTH_ALERTS not in frame.columns:
        return None
    fired = fired_flags(frame)
    if not fired:
        return "run health: no rule left its healthy range"
    parts = [
        f"{k[len(HEALTH_PREFIX) :]} at steps {_spans([int(s) for s in frame.index[frame[k] >= 1]])}" for k in fired
    ]
    return "run health: " + "; ".join(parts)


def control_level(metrics_jsonl: str | os.PathLike[str] | None, key: str) -> float | None:
    """The final ``key`` (a validation success) of the same-time SFT control that ``benchmarks/rl_vs_sft.py`` ran
    beside this run (:data:`CONTROL_DIR`), or None."""
    if metrics_jsonl is None:
        return None
    log_dir = Path(metrics_jsonl).resolve().parent
    run_dir = log_dir.parent
    if run_dir.name == CONTROL_DIR:
        return None
    path = run_dir.parent / CONTROL_DIR / log_dir.name / Path(metrics_jsonl).name
    if not path.is_file():
        return None
    values = load_metrics(str(path)).get(key, pd.Series(dtype=float)).dropna()
    return float(values.iloc[-1]) if len(values) else None


def reference_levels(frame: pd.DataFrame, key: str, control: float | None = None) -> list[tuple[str, float]]:
    """The levels validation series ``key`` is to beat, as ``(label, value)``: its step-0 value (the warm start's
    level when the run warm-started, which logs ``sft/*`` at step 0) and ``control`` (the SFT control's final value,
    :func:`control_level`)."""
    out = []
    if 0 in frame.index and key in frame.columns and not math.isnan(frame.loc[0, key]):
        warm = any(c.startswith("sft/") and not math.isnan(frame.loc[0, c]) for c in frame.columns)
        out.append(("warm start (step 0)" if warm else "step 0", float(frame.loc[0, key])))
    if control is not None:
        out.append(("SFT control, same time", control))
    return out


def _draw_references(ax: Axes, levels: list[tuple[str, float]]) -> None:
    for (label, value), color in zip(levels, REFERENCE_COLORS):
        ax.axhline(value, color=color, linestyle="--", linewidth=1.2, label=f"{label}: {_format(value, ax)}", zorder=2)
        ax.update_datalim([(ax.get_xlim()[0], value)], updatex=False)
    ax.autoscale_view()


def _draw_alert_marks(ax: Axes, frame: pd.DataFrame, label: str | None) -> None:
    """Triangles on the step axis at the steps where a health rule fired (``label``: their legend entry)."""
    if HEALTH_ALERTS not in frame.columns:
        return
    steps = frame.index[frame[HEALTH_ALERTS] >= 1]
    if len(steps):
        ax.plot(
            steps,
            [0.0] * len(steps),
            transform=ax.get_xaxis_transform(),
            linestyle="none",
            marker="^",
            markersize=6,
            color=ALERT_COLOR,
            clip_on=False,
            zorder=4,
            label=label,
        )


def _draw_events(ax: Axes, frame: pd.DataFrame, plan: PanelPlan) -> None:
    """One row per flag column, a marker at each step where it is 1."""
    for row, key in enumerate(plan.keys):
        steps = frame.index[frame[key] >= 1]
        ax.plot(steps, [row] * len(steps), linestyle="none", marker="s", markersize=5, color=ALERT_COLOR)
    ax.set_yticks(range(len(plan.keys)), [k[len(plan.panel.events) :] for k in plan.keys], fontsize=8)
    ax.set_ylim(-0.7, len(plan.keys) - 0.3)
    ax.set_xlim(float(frame.index.min()) - 0.5, float(frame.index.max()) + 0.5)


def _draw_series(ax: Axes, frame: pd.DataFrame, key: str, val: bool, label: str = "training") -> None:
    """A validation series: points joined by a line, labeled with their values when there are few. A training
    series: the raw values faint, the smoothed curve on top."""
    series = frame[key].dropna()
    if val:
        ax.plot(
            series.index,
            series.to_numpy(),
            color=VAL_COLOR,
            marker="o",
            markersize=5,
            linewidth=1.2,
            label="validation",
            zorder=3,
        )
        if len(series) <= 12:
            for x, y in series.items():
                ax.annotate(
                    _format(y, ax),
                    (x, y),
                    textcoords="offset points",
                    xytext=(0, 7),
                    ha="center",
                    fontsize=8,
                    color=VAL_COLOR,
                )
        return
    many = len(series) > 12
    ax.plot(
        series.index,
        series.to_numpy(),
        color=TRAIN_COLOR,
        alpha=0.3 if many else 1.0,
        linewidth=1,
        marker=None if many else "o",
        markersize=3,
        label="training" if many else label,
    )
    if many:
        smoothed, span = smooth(series)
        ax.plot(smoothed.index, smoothed.to_numpy(), color=TRAIN_COLOR, linewidth=2, label=f"smoothed (EMA {span})")


def _format(value: float, ax: Axes) -> str:
    return f"{value:.1%}" if isinstance(ax.yaxis.get_major_formatter(), PercentFormatter) else f"{value:.3g}"


def _draw_stacked(ax: Axes, frame: pd.DataFrame, plan: PanelPlan) -> None:
    """The step time as stacked phases; ``other`` is what ``time/step`` has beyond the listed phases."""
    rows = frame[frame["time/step"].notna()]
    labels = dict(plan.panel.stacked)
    parts = [rows[k].fillna(0.0).clip(lower=0.0) for k in plan.keys]
    other = (rows["time/step"] - sum(parts)).clip(lower=0.0)
    names = [labels[k] for k in plan.keys] + ["other"]
    if len(rows) > 60:
        ax.stackplot(rows.index, *[p.to_numpy() for p in parts], other.to_numpy(), labels=names, alpha=0.85)
    else:
        bottom = pd.Series(0.0, index=rows.index)
        for part, name in zip(parts + [other], names):
            ax.bar(rows.index, part.to_numpy(), bottom=bottom.to_numpy(), width=0.85, label=name)
            bottom += part
    top = float((rows["time/step"]).max())
    ax.set_ylim(0, top * (1.15 + 0.13 * math.ceil(len(names) / 2)))  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper left", ncols=2, framealpha=0.8)


def _axes_grid(fig: Figure, n: int, max_cols: int) -> list[Axes]:
    cols = min(n, max_cols)
    rows = (n + cols - 1) // cols
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    return axes[:n]


def _style(ax: Axes, title: str, percent: bool) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.04, y=0.18)  # room for the value labels of validation points
    if percent:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))


def draw_dashboard(
    frame: pd.DataFrame, title: str = "", panels: Sequence[Panel] = DASHBOARD, control: float | None = None
) -> tuple[Figure, list[str]]:
    """The dashboard figure of a metrics frame (see :func:`load_metrics`) and the metric keys it draws;
    ``control``: the SFT control's final validation success (:func:`control_level`), drawn as a reference line.

    Raises:
        ValueError: no panel has a series that varies; the message lists the available keys.
    """
    plans, notes = plan_dashboard(frame, panels)
    if not any(not plan.panel.events for plan in plans):
        raise ValueError(f"no dashboard metric varies in this run; pass keys (--keys) from: {sorted(frame.columns)}.")
    cols = 4 if len(plans) >= 7 else 3
    fig = Figure(figsize=(3.7 * min(cols, len(plans)), 2.9 * math.ceil(len(plans) / cols) + 0.6), layout="constrained")
    drawn: list[str] = []
    for ax, plan in zip(_axes_grid(fig, len(plans), cols), plans):
        _style(ax, plan.panel.title, plan.panel.percent)
        if plan.panel.stacked:
            _draw_stacked(ax, frame, plan)
        elif plan.panel.events:
            _draw_events(ax, frame, plan)
        else:
            for key in plan.keys:
                _draw_series(ax, frame, key, val=key in plan.panel.val)
            val = next((k for k in plan.keys if k in plan.panel.val), None)
            if plan.panel.references and val:
                _draw_references(ax, reference_levels(frame, val, control))
            _draw_alert_marks(ax, frame, "health alert" if plan.panel.references else None)
            ax.legend(fontsize=7, framealpha=0.8)
        drawn += plan.keys
    if title:
        fig.suptitle(title, fontsize=11)
    lines = ["constant, not drawn: " + ", ".join(notes)] if notes else []
    lines += [note for note in [health_note(frame)] if note]
    if lines:
        fig.supxlabel("\n".join(lines), fontsize=8, color="#555555", wrap=True)
    return fig, drawn


def draw_keys(frame: pd.DataFrame, keys: Sequence[str], title: str = "") -> Figure:
    """One panel per metric key (value against step; smoothed when noisy and long)."""
    fig = Figure(figsize=(4.5 * min(3, len(keys)), 3.2 * math.ceil(len(keys) / 3)), layout="constrained")
    for ax, key in zip(_axes_grid(fig, len(keys), 3), keys):
        _style(ax, key, percent=False)
        _draw_series(ax, frame, key, val=key.startswith("val/"), label=key)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_metrics(metrics_jsonl: str, out_png: str, keys: list[str] | None = None) -> list[str]:
    """Draw the dashboard (``keys=None``) or one panel per key, and save the figure as ``out_png``.

    Args:
        metrics_jsonl: path of a ``metrics.jsonl`` written by a tracker.
        out_png: output image path (the format follows the extension); parent directories are created.
        keys: metric keys or patterns such as ``"val/*"``; ``None`` = the dashboard (:data:`DASHBOARD`).

    Returns:
        The metric keys plotted, in panel order.

    Raises:
        ValueError: a given key matches no metric, or (dashboard) no dashboard metric varies.
    """
    frame = load_metrics(metrics_jsonl)
    if keys is None:
        val = next((k for p in DASHBOARD if p.references for k in p.val if k in frame.columns), None)
        control = control_level(metrics_jsonl, val) if val else None
        fig, chosen = draw_dashboard(frame, metrics_jsonl, control=control)
    else:
        chosen = select_keys(list(frame.columns), keys, strict=True)
        fig = draw_keys(frame, chosen, metrics_jsonl)
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
    parser.add_argument("--keys", nargs="+", help="metric keys or patterns such as 'val/*' (default: the dashboard)")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(os.path.dirname(args.metrics_jsonl), "metrics.png")
    try:
        plotted = plot_metrics(args.metrics_jsonl, out, args.keys)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(plotted)} series: {', '.join(plotted)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
