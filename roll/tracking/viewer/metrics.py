"""The viewer's metrics: the steps table, the chart series and the dashboard image, from ``metrics.jsonl``; the
run-health events from ``health.jsonl`` beside it.

Columns and charts follow :data:`roll.tracking.plot.DASHBOARD`, so the viewer shows what ``metrics.png`` shows: the
success chart carries the levels to beat (``refs``: the warm start's, the SFT control's) and every chart the steps
where a health rule fired (``alerts``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from roll.tracking.health import HEALTH_FILE, read_events
from roll.tracking.plot import (
    DASHBOARD,
    HEALTH_ALERTS,
    control_level,
    draw_dashboard,
    fired_flags,
    health_note,
    load_metrics,
    plan_dashboard,
    reference_levels,
    smooth,
)

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
    if HEALTH_ALERTS in frame.columns:
        columns.append({"key": HEALTH_ALERTS, "label": "health alerts", "percent": False})
    return columns


def charts(frame: pd.DataFrame, control: float | None = None) -> list[dict[str, Any]]:
    """The dashboard's line panels as series: training values, their smoothed curve (long runs) and validation;
    ``refs`` (``[{"label", "value"}]``, the levels the validation series is to beat) and ``alerts`` (``[[step,
    [rule, ...]], ...]``, the steps where a health rule fired)."""
    out = []
    plans, _ = plan_dashboard(frame)
    alerts = alert_steps(frame)
    for plan in plans:
        if plan.panel.stacked or plan.panel.events:
            continue
        chart: dict[str, Any] = {"title": plan.panel.title, "percent": plan.panel.percent, "keys": plan.keys}
        for key in plan.keys:
            series = frame[key].dropna()
            if key in plan.panel.val:
                chart["val"] = _points(series)
                if plan.panel.references:
                    chart["refs"] = [{"label": lb, "value": v} for lb, v in reference_levels(frame, key, control)]
            else:
                chart["train"] = _points(series)
                if len(series) > 12:
                    chart["smooth"] = _points(smooth(series)[0])
        if alerts:
            chart["alerts"] = alerts
        out.append(chart)
    return out


def alert_steps(frame: pd.DataFrame) -> list[list[Any]]:
    """``[[step, [rule, ...]], ...]``: the steps where health rules fired, and which."""
    fired = fired_flags(frame)
    rows = frame.index[(frame[fired] >= 1).any(axis=1)] if fired else []
    return [[int(step), [k.split("/", 1)[1] for k in fired if frame.loc[step, k] >= 1]] for step in rows]


def metrics_payload(metrics_jsonl: Path | None, dashboard_png: Path, title: str = "") -> dict[str, Any]:
    """``columns``, ``steps`` (one row per step: ``{"step", "values": {key: value | null}}``), ``charts``,
    ``notes`` (constant series left out), ``health`` (``{"checked", "note", "events"}``: whether the run had the
    health check, its one-line summary and the events of ``health.jsonl``) and ``dashboard`` (the image's file
    name, or None) for ``run.js``."""
    empty: dict[str, Any] = {
        "columns": [],
        "steps": [],
        "charts": [],
        "notes": [],
        "health": {"checked": False, "note": None, "events": []},
        "dashboard": None,
    }
    if metrics_jsonl is None:
        return empty
    frame = load_metrics(str(metrics_jsonl))
    if frame.empty:
        return empty
    val = next((k for p in DASHBOARD if p.references for k in p.val if k in frame.columns), None)
    control = control_level(metrics_jsonl, val) if val else None
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
        "charts": charts(frame, control),
        "notes": plan_dashboard(frame)[1],
        "health": {
            "checked": HEALTH_ALERTS in frame.columns,
            "note": health_note(frame),
            "events": read_events(metrics_jsonl.parent / HEALTH_FILE),
        },
        "dashboard": None,
    }
    try:
        fig, _ = draw_dashboard(frame, title, control=control)
    except ValueError:  # nothing varies (e.g. one step): the table and charts still show the values
        return payload
    fig.savefig(dashboard_png, dpi=100)
    payload["dashboard"] = dashboard_png.name
    return payload
