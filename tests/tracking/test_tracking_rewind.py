"""A resumed run's logs hold each step once: trackers rewind to the checkpoint step, per-step dumps after it go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.tracking import make_tracker
from roll.tracking.rewind import prune_step_dumps, truncate_jsonl


def write_records(path: Path, steps: list[int], torn: bool = False) -> None:
    lines = [json.dumps({"step": s, "x": float(s)}) for s in steps]
    path.write_text("\n".join(lines) + "\n" + ('{"step": 9, "x"' if torn else ""))


def records(path: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["x"]) for r in map(json.loads, path.read_text().splitlines())]


def test_truncate_jsonl_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_records(path, [0, 0, 1, 2, 3, 4, 5], torn=True)
    assert truncate_jsonl(path, 3) == 3  # steps 4, 5 and the torn line
    assert records(path) == [(0, 0.0), (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]
    assert truncate_jsonl(path, 3) == 0 and truncate_jsonl(tmp_path / "none.jsonl", 3) == 0


def test_prune_step_dumps_removes_only_later_steps_of_the_dumps(tmp_path):
    for phase in ("train", "val"):
        (tmp_path / "trajectories" / phase).mkdir(parents=True)
        for step in (2, 3, 4, 10):
            (tmp_path / "trajectories" / phase / f"step_{step:05d}.jsonl").write_text("{}\n")
    (tmp_path / "trajectories" / "meta.json").write_text("{}")
    renders = tmp_path / "renders"
    for step in (3, 4):
        (renders / f"step_{step:05d}" / "traj").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_4").mkdir(parents=True)  # not a dump: never touched
    removed = prune_step_dumps(tmp_path, 3, [renders])
    assert sorted(p.relative_to(tmp_path).as_posix() for p in removed) == [
        "renders/step_00004",
        "trajectories/train/step_00004.jsonl",
        "trajectories/train/step_00010.jsonl",
        "trajectories/val/step_00004.jsonl",
        "trajectories/val/step_00010.jsonl",
    ]
    assert sorted(p.name for p in (tmp_path / "trajectories" / "train").iterdir()) == [
        "step_00002.jsonl",
        "step_00003.jsonl",
    ]
    assert (renders / "step_00003").is_dir() and (tmp_path / "checkpoints" / "step_4").is_dir()
    assert (tmp_path / "trajectories" / "meta.json").is_file()


def run_then_resume(track_with: str, log_dir: Path, **kwargs) -> None:
    """Steps 1-5 logged (with texts), a 'kill', a resume from the step-3 checkpoint that replays 4-5 (x10)."""
    first = make_tracker(track_with, exp_name="e", log_dir=str(log_dir), **kwargs)
    for step in range(1, 6):
        first.log({"x": float(step)}, step=step)
        first.log_text("sample", f"text {step}", step=step)
    first.finish()
    resumed = make_tracker(track_with, exp_name="e", log_dir=str(log_dir), run_id=first.run_id, **kwargs)
    resumed.rewind(3)
    for step in (4, 5):
        resumed.log({"x": 10.0 * step}, step=step)
        resumed.log_text("sample", f"replayed {step}", step=step)
    resumed.finish()


@pytest.mark.parametrize("track_with", ["stdout", "tensorboard"])
def test_resumed_run_logs_each_step_once(track_with, tmp_path, capsys):
    run_then_resume(track_with, tmp_path)
    assert records(tmp_path / "metrics.jsonl") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]
    texts = [(r["step"], r["text"]) for r in map(json.loads, (tmp_path / "texts.jsonl").read_text().splitlines())]
    assert texts == [(1, "text 1"), (2, "text 2"), (3, "text 3"), (4, "replayed 4"), (5, "replayed 5")]
    assert "dropped 2 record(s) after step 3" in capsys.readouterr().out


def test_tensorboard_purges_the_replayed_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_then_resume("tensorboard", tmp_path)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]


def test_tensorboard_without_rewind_would_show_replayed_steps_twice(tmp_path):
    """The failure the rewind fixes (the control of the test above)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = make_tracker("tensorboard", exp_name="e", log_dir=str(tmp_path))
    for step in range(1, 6):
        first.log({"x": float(step)}, step=step)
    first.finish()
    resumed = make_tracker("tensorboard", exp_name="e", log_dir=str(tmp_path), run_id=first.run_id)
    resumed.log({"x": 40.0}, step=4)
    resumed.finish()
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("x")].count(4) == 2
    assert [r["step"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())].count(4) == 2


def test_wandb_resume_rewinds_its_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed; the W&B tracker is optional")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    run_then_resume("wandb", tmp_path / "logs", tracker_kwargs={"project": "roll-test"})
    assert records(tmp_path / "logs" / "metrics.jsonl") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]


def test_new_tensorboard_run_in_a_used_directory_purges_the_old_events(tmp_path):
    """A run killed before its first checkpoint starts over: its events must not double the new run's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for scale in (1.0, 10.0):
        tracker = make_tracker("tensorboard", exp_name="e", log_dir=str(tmp_path))
        for step in (1, 2):
            tracker.log({"x": scale * step}, step=step)
        tracker.finish()
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(1, 10.0), (2, 20.0)]
