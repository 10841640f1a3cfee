"""metrics.jsonl loading (merging, nulls, broken lines), plot output and the plot CLI."""

from __future__ import annotations

import json
import math
import os

import pytest

from roll.tracking import make_tracker
from roll.tracking.plot import load_metrics, main, plot_metrics, select_keys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_load_merges_steps_later_values_win(tmp_path) -> None:
    path = write_jsonl(tmp_path / "metrics.jsonl", [
        json.dumps({"step": 1, "timestamp": 1.0, "a/x": 1.0, "a/y": 5.0}),
        json.dumps({"step": 0, "timestamp": 2.0, "a/x": 0.5}),
        json.dumps({"step": 1, "timestamp": 3.0, "a/x": 2.0, "val/s": None}),  # resumed run re-logs step 1
        "",
        '{"step": 2, "a/x": 3',  # cut off by a crash
    ])
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
        "rollout/success_rate", "val/a", "val/b"]
    with pytest.raises(ValueError, match=r"key 'time/step' matches no metric; available keys: \['actor/pg_loss'"):
        select_keys(available, ["time/step"], strict=True)


@pytest.fixture
def tracked_run(tmp_path) -> str:
    """A metrics.jsonl from a real tracker: 6 steps, validation every 2 steps."""
    with make_tracker("stdout", exp_name="plot", log_dir=str(tmp_path / "logs")) as tracker:
        for step in range(6):
            tracker.log({"rollout/success_rate": step / 10, "actor/pg_loss": 1.0 / (step + 1),
                         "critic/vf_loss": 0.1}, step)
            if step % 2 == 0:
                tracker.log({"val/success_rate": step / 8, "val/mean_reward": -1.0 + step / 8}, step)
    return tracker.metrics_path


def test_plot_default_keys_writes_png(tracked_run, tmp_path) -> None:
    out = str(tmp_path / "figs" / "curves.png")
    plotted = plot_metrics(tracked_run, out)
    assert plotted == ["rollout/success_rate", "val/mean_reward", "val/success_rate", "actor/pg_loss"]
    with open(out, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert os.path.getsize(out) > 5000


def test_plot_explicit_keys_and_errors(tracked_run, tmp_path) -> None:
    assert plot_metrics(tracked_run, str(tmp_path / "c.png"), keys=["critic/*"]) == ["critic/vf_loss"]
    with pytest.raises(ValueError, match="key 'time/step' matches no metric"):
        plot_metrics(tracked_run, str(tmp_path / "d.png"), keys=["time/step"])
    assert not os.path.exists(tmp_path / "d.png")
    only_other = write_jsonl(tmp_path / "other.jsonl", [json.dumps({"step": 0, "x/y": 1.0})])
    with pytest.raises(ValueError, match=r"pass keys \(--keys\) from: \['x/y'\]"):
        plot_metrics(only_other, str(tmp_path / "e.png"))


def test_cli_default_output_next_to_input(tracked_run, capsys) -> None:
    assert main([tracked_run, "--keys", "val/*", "actor/pg_loss"]) == 0
    out = os.path.join(os.path.dirname(tracked_run), "metrics.png")
    assert os.path.getsize(out) > 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {out} (3 panels: val/mean_reward, val/success_rate, actor/pg_loss)")


def test_cli_bad_input_exit_status_2(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert "error:" in capsys.readouterr().err
