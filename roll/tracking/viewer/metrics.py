"""The viewer's metrics: the steps table, the chart series and the dashboard image, from ``metrics.jsonl``.

Columns and charts follow :data:`roll.tracking.plot.DASHBOARD`, so the viewer shows what ``metrics.png`` shows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from roll.tracking.plot import DASHBOARD, draw_dashboard, load_metrics, plan_dashboard, smooth

STEP_TIME = "time/step"


def _points(series: pd.Series) -> list[list[float]]:
    """``[[step, value], ...]`` without NaN."""
    return [[int(s), float(v)] for s, v in series.dropna().items()]


def _finite(value: float) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def table_columns(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """One column per dashboard panel's training key that the run logs (validation success right after training
    success), then the step time."""
    columns: list[dict[str, Any]] = []
    for panel in DASHBOARD:
        train = next((k for k in panel.train if k in frame.columns), None)
        if train:
            columns.append({"key": train, "label": panel.title, "percent": panel.percent})
        val = next((k for k in panel.val if k in frame.columns), None)
        if val and panel is DASHBOARD[0]:
            columns.append({"key": val, "label": f"validation {panel.title}", "percent": panel.percent})
    if STEP_TIME in frame.columns:
        columns.append({"key": STEP_TIME, "label": "step time (s)", "percent": False})
    return columns


def charts(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The dashboard's line panels as series: training values, their smoothed curve (long runs) and validation."""
    out = []
    plans, _ = plan_dashboard(frame)
    for plan in plans:
        if plan.panel.stacked:
            continue
        chart: dict[str, Any] = {"title": plan.panel.title, "percent": plan.panel.percent, "keys": plan.keys}
        for key in plan.keys:
            series = frame[key].dropna()
            if key in plan.panel.val:
                chart["val"] = _points(series)
            else:
                chart["train"] = _points(series)
                if len(series) > 12:
                    chart["smooth"] = _points(smooth(series)[0])
        out.append(chart)
    return out


def metrics_payload(metrics_jsonl: Path | None, dashboard_png: Path, title: str = "") -> dict[str, Any]:
    """``columns``, ``steps`` (one row per step: ``{"step", "values": {key: value | null}}``), ``charts``,
    ``notes`` (constant series left out) and ``dashboard`` (the image's file name, or None) for ``run.js``."""
    empty: dict[str, Any] = {"columns": [], "steps": [], "charts": [], "notes": [], "dashboard": None}
    if metrics_jsonl is None:
        return empty
    frame = load_metrics(str(metrics_jsonl))
    if frame.empty:
        return empty
    columns = table_columns(frame)
    keys = [c["key"] for c in columns]
    steps = [
        {"step": int(step), "values": {k: _finite(row[k]) for k in keys}}
        for step, row in frame[keys].iterrows()
        if any(_finite(row[k]) is not None for k in keys)
    ]
    payload = {
        "columns": columns,
        "steps": steps,
        "charts": charts(frame),
        "notes": plan_dashboard(frame)[1],
        "dashboard": None,
    }
    try:
        fig, _ = draw_dashboard(frame, title)
    except ValueError:  # nothing varies (e.g. one step): the table and charts still show the values
        return payload
    fig.savefig(dashboard_png, dpi=100)
    payload["dashboard"] = dashboard_png.name
    return payload
