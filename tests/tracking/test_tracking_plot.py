"""metrics.jsonl loading (merging, nulls, broken lines), the dashboard (panels, smoothing, constants left out),
plot output and the plot CLI."""

from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest

from roll.tracking import make_tracker
from roll.tracking.plot import load_metrics, main, plan_dashboard, plot_metrics, select_keys, smooth

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
