"""metrics.jsonl loading (merging, nulls, broken lines), the dashboard (panels, smoothing, constants left out),
plot output and the plot CLI."""

from __future__ import annotations

import io
import json
import math
import os

import pandas as pd
import pytest

from roll.tracking import make_tracker
from roll.tracking.plot import (
    control_level,
    draw_dashboard,
    health_note,
    load_metrics,
    main,
    plan_dashboard,
    plot_metrics,
    reference_levels,
    select_keys,
    smooth,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_load_merges_steps_later_values_win(tmp_path) -> None:
    path = write_jsonl(
        tmp_path / "metrics.jsonl",
        [
            json.dumps({"step": 1, "timestamp": 1.0, "a/x": 1.0, "a/y": 5.0}),
            json.dumps({"step": 0, "timestamp": 2.0, "a/x": 0.5}),
            json.dumps({"step": 1, "timestamp": 3.0, "a/x": 2.0, "val/s": None}),  # resumed run re-logs step 1
            "",
            '{"step": 2, "a/x": 3',  # cut off by a crash
        ],
    )
    with pytest.warns(UserWarning, match="metrics.jsonl:5: skipping"):
        frame = load_metrics(path)
    assert list(frame.index) == [0, 1]
    assert sorted(frame.columns) == ["a/x", "a/y", "val/s"]
    assert list(frame["a/x"]) == [0.5, 2.0]
    assert math.isnan(frame.loc[0, "a/y"]) and frame.loc[1, "a/y"] == 5.0
    assert math.isnan(frame.loc[1, "val/s"])


def test_select_keys_patterns_in_order() -> None:
    available = ["val/b", "actor/pg_loss", "val/a", "rollout/success_rate"]
    assert select_keys(available, ["rollout/success_rate", "val/*", "time/step", "val/a"], strict=False) == [
        "rollout/success_rate",
        "val/a",
        "val/b",
    ]
    with pytest.raises(ValueError, match=r"key 'time/step' matches no metric; available keys: \['actor/pg_loss'"):
        select_keys(available, ["time/step"], strict=True)


@pytest.fixture
def tracked_run(tmp_path) -> str:
    """A metrics.jsonl from a real tracker: 30 steps, validation every 10 steps, an invalid-action rate stuck at 0
    and a phase (offload/reload) that never takes time."""
    with make_tracker("stdout", exp_name="plot", log_dir=str(tmp_path / "logs")) as tracker:
        for step in range(31):
            if step:
                tracker.log(
                    {
                        "rollout/success_rate": (step % 7) / 10,
                        "rollout/mean_reward": step / 3,
                        "rollout/invalid_action_rate": 0.0,
                        "actor/pg_loss": 1.0 / step,
                        "actor/entropy": 1.0 - step / 60,
                        "critic/vf_loss": 0.1,
                        "rollout/batch_size": 64,
                        "time/rollout": 1.0 + step % 2,
                        "time/train": 2.0,
                        "time/offload_reload": 0.0,
                        "time/step": 3.5 + step % 2,
                    },
                    step,
                )
            if step % 10 == 0:
                tracker.log({"val/success_rate": step / 80, "val/mean_reward": -1.0 + step / 8}, step)
    return tracker.metrics_path


def test_smooth_is_bias_corrected_ema() -> None:
    # span 3 -> alpha 1/2; y_t = sum_i (1/2)^i x_(t-i) / sum_i (1/2)^i
    smoothed, span = smooth(pd.Series([0.0, 1.0, 2.0, 3.0], index=[1, 2, 3, 4]))
    assert span == 3
    assert smoothed.tolist() == pytest.approx([0.0, 1 / 1.5, 2.5 / 1.75, 4.25 / 1.875])
    assert smooth(pd.Series(range(100), dtype=float))[1] == 10


def test_dashboard_plan_leaves_out_constants_and_notes_them(tracked_run) -> None:
    plans, notes = plan_dashboard(load_metrics(tracked_run))
    assert [(p.panel.title, p.keys) for p in plans] == [
        ("success rate", ["rollout/success_rate", "val/success_rate"]),
        ("mean reward", ["rollout/mean_reward", "val/mean_reward"]),
        ("entropy", ["actor/entropy"]),
        ("step time (s)", ["time/rollout", "time/train"]),
    ]
    assert notes == ["rollout/invalid_action_rate = 0", "time/offload_reload = 0"]


def test_dashboard_takes_rlvr_keys(tmp_path) -> None:
    lines = [
        json.dumps(
            {
                "step": s,
                "rollout/accuracy": s / 10,
                "rollout/format_rate": 1.0 - s / 20,
                "rollout/response_length": 30 + s,
            }
        )
        for s in range(1, 5)
    ]
    plans, notes = plan_dashboard(load_metrics(write_jsonl(tmp_path / "m.jsonl", lines)))
    assert [p.panel.title for p in plans] == ["success rate", "format rate", "response length (tokens)"]
    assert notes == []


def test_plot_dashboard_writes_png(tracked_run, tmp_path) -> None:
    out = str(tmp_path / "figs" / "curves.png")
    plotted = plot_metrics(tracked_run, out)
    assert plotted == [
        "rollout/success_rate",
        "val/success_rate",
        "rollout/mean_reward",
        "val/mean_reward",
        "actor/entropy",
        "time/rollout",
        "time/train",
    ]
    with open(out, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert os.path.getsize(out) > 5000


def test_plot_explicit_keys_and_errors(tracked_run, tmp_path) -> None:
    assert plot_metrics(tracked_run, str(tmp_path / "c.png"), keys=["critic/*"]) == ["critic/vf_loss"]
    with pytest.raises(ValueError, match="key 'time/sync' matches no metric"):
        plot_metrics(tracked_run, str(tmp_path / "d.png"), keys=["time/sync"])
    assert not os.path.exists(tmp_path / "d.png")
    only_other = write_jsonl(tmp_path / "other.jsonl", [json.dumps({"step": 0, "x/y": 1.0})])
    with pytest.raises(
        ValueError,
        match=r"no dashboard metric varies in this run; pass keys \(--keys\) from: "
        r"\['x/y'\]",
    ):
        plot_metrics(only_other, str(tmp_path / "e.png"))


def test_cli_default_output_next_to_input(tracked_run, capsys) -> None:
    assert main([tracked_run, "--keys", "val/*", "actor/pg_loss"]) == 0
    out = os.path.join(os.path.dirname(tracked_run), "metrics.png")
    assert os.path.getsize(out) > 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {out} (3 series: val/mean_reward, val/success_rate, actor/pg_loss)"
    )


def test_cli_bad_input_exit_status_2(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert "error:" in capsys.readouterr().err


def health_run(root) -> str:
    """A run laid out as benchmarks/rl_vs_sft.py lays out a seed (``<root>/seed1/rl`` and its ``control``): a warm
    start and a first validation at step 0, 12 RL steps with the real run-health check, where the approx KL of steps
    4-7 is out of range (the rule fires at step 6, recovers at step 8)."""
    from roll.config.health import RunHealthConfig
    from roll.tracking.health import RunHealth

    logs = root / "seed1" / "rl" / "logs"
    health = RunHealth(RunHealthConfig(), logs, stream=io.StringIO())
    with make_tracker("stdout", exp_name="rl", log_dir=str(logs)) as tracker:
        tracker.log({"sft/final_loss": 0.4, "sft/steps": 600.0}, 0)
        tracker.log({"val/success_rate": 0.5, **health(0, {"val/success_rate": 0.5})}, 0)
        for step in range(1, 13):
            metrics = {"rollout/success_rate": 0.4 + step / 100, "actor/approx_kl": 0.1 if 4 <= step <= 7 else 0.001}
            if step % 6 == 0:
                metrics["val/success_rate"] = 0.5 + step / 100
            tracker.log({**metrics, **health(step, metrics)}, step)
    with make_tracker("stdout", exp_name="control", log_dir=str(root / "seed1" / "control" / "logs")) as tracker:
        tracker.log({"sft/steps": 900.0}, 0)
        tracker.log({"val/success_rate": 0.45}, 0)
        tracker.log({"val/success_rate": 0.52}, 1)
    return str(logs / "metrics.jsonl")


def test_levels_to_beat_the_warm_start_and_the_sft_control(tmp_path) -> None:
    path = health_run(tmp_path)
    frame = load_metrics(path)
    assert control_level(path, "val/success_rate") == 0.52  # the control's final validation
    assert reference_levels(frame, "val/success_rate", 0.52) == [
        ("warm start (step 0)", 0.5),
        ("SFT control, same time", 0.52),
    ]
    # the control's own plot has no control beside it; a run without one, no control level; no warm start: "step 0"
    assert control_level(str(tmp_path / "seed1" / "control" / "logs" / "metrics.jsonl"), "val/success_rate") is None
    lone = write_jsonl(tmp_path / "m.jsonl", [json.dumps({"step": 0, "val/accuracy": 0.1})])
    assert control_level(lone, "val/accuracy") is None
    assert reference_levels(load_metrics(lone), "val/accuracy") == [("step 0", 0.1)]


def test_the_dashboard_draws_the_levels_and_the_health_alerts(tmp_path) -> None:
    path = health_run(tmp_path)
    frame = load_metrics(path)
    plans, _ = plan_dashboard(frame)
    assert [(p.panel.title, p.keys) for p in plans][-1] == ("run health: rules firing", ["health/approx_kl"])
    assert health_note(frame) == "run health: approx_kl at steps 6-7"
    fig, drawn = draw_dashboard(frame, control=0.52)
    success = fig.axes[0]
    levels = sorted(round(line.get_ydata()[0], 4) for line in success.get_lines() if line.get_linestyle() == "--")
    assert levels == [0.5, 0.52]
    assert success.get_ylim()[1] > 0.56 and success.get_ylim()[0] < 0.41  # every level and point in view
    marks = [line for line in success.get_lines() if line.get_marker() == "^"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [6, 7]
    assert "run health: approx_kl at steps 6-7" in fig.get_supxlabel()
    assert "health/approx_kl" in drawn
    assert plot_metrics(path, str(tmp_path / "m.png"))[-1] == "health/approx_kl"
    quiet = load_metrics(
        write_jsonl(tmp_path / "q.jsonl", [json.dumps({"step": s, "a/b": s, "health/alerts": 0}) for s in range(3)])
    )
    assert health_note(quiet) == "run health: no rule left its healthy range"
    assert health_note(load_metrics(path).drop(columns=["health/alerts"])) is None  # a run without the check
