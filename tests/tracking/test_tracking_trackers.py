"""Trackers: stdout line format, metrics.jsonl records, registry errors, TensorBoard events, W&B offline runs."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import torch

from roll.tracking import base, make_tracker
from roll.tracking.base import Tracker, TrackerOptions, register_tracker
from roll.tracking.stdout import StdoutTracker, format_metrics_line, format_value

METRICS = {"b/x": 2, "rollout/mean_reward": -0.41, "a/z": np.float32(1.0), "rollout/success_rate": 0.31249}
LINE = "step 3 | rollout/success_rate 0.3125 | rollout/mean_reward -0.41 | a/z 1 | b/x 2"


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def strip_time(records: list[dict]) -> list[dict]:
    for r in records:
        assert isinstance(r.pop("timestamp"), float)
    return records


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.31249, "0.3125"),
        (-0.41, "-0.41"),
        (12.0, "12"),
        (1234567.0, "1.235e+06"),
        (1.5e-5, "1.5e-05"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
    ],
)
def test_format_value_four_significant_digits(value: float, text: str) -> None:
    assert format_value(value) == text


def test_line_puts_headline_keys_first_then_sorted() -> None:
    assert format_metrics_line(3, {k: float(v) for k, v in METRICS.items()}, base.DEFAULT_HEADLINE_KEYS) == LINE
    assert format_metrics_line(0, {"b": 1.0, "a": 2.0}, ["b", "missing"]) == "step 0 | b 1 | a 2"


def test_stdout_tracker_prints_line_and_writes_jsonl(tmp_path, capsys) -> None:
    tracker = make_tracker("stdout", exp_name="e", log_dir=str(tmp_path / "logs"), config={"lr": 0.1})
    tracker.log(METRICS, step=3)
    tracker.log({"val/success_rate": torch.tensor(0.5), "actor/pg_loss": float("nan")}, step=3)
    tracker.log_text("rollout/sample", "line 1\nline 2", step=3)
    tracker.finish()
    tracker.finish()  # idempotent
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"tracking: starting run {tracker.run_id} of 'e', metrics -> {tmp_path / 'logs' / 'metrics.jsonl'}"
    assert out[1:] == [
        LINE,
        "step 3 | val/success_rate 0.5 | actor/pg_loss nan",
        "step 3 | rollout/sample:",
        "line 1",
        "line 2",
    ]
    assert strip_time(read_jsonl(str(tmp_path / "logs" / "metrics.jsonl"))) == [
        {"step": 3, "b/x": 2.0, "rollout/mean_reward": -0.41, "a/z": 1.0, "rollout/success_rate": 0.31249},
        {"step": 3, "val/success_rate": 0.5, "actor/pg_loss": None},
    ]
    assert read_jsonl(str(tmp_path / "logs" / "texts.jsonl")) == [
        {"step": 3, "key": "rollout/sample", "text": "line 1\nline 2"}
    ]
    assert len(tracker.run_id) == 8 and int(tracker.run_id, 16) >= 0
    with pytest.raises(RuntimeError, match="after finish"):
        tracker.log({"a/b": 1.0}, step=4)


def test_custom_headline_keys_from_tracker_kwargs(tmp_path, capsys) -> None:
    with make_tracker("stdout", exp_name="e", log_dir=str(tmp_path), tracker_kwargs={"headline_keys": ["b/x"]}) as t:
        t.log({"a/z": 1.0, "b/x": 2.0, "c/y": 3.0}, step=0)
    assert capsys.readouterr().out.splitlines()[-1] == "step 0 | b/x 2 | a/z 1 | c/y 3"


def test_new_run_truncates_and_resumed_run_appends(tmp_path, capsys) -> None:
    log_dir = str(tmp_path)
    with make_tracker("stdout", exp_name="e", log_dir=log_dir) as first:
        first.log({"a/x": 1.0}, step=0)
    with make_tracker("stdout", exp_name="e", log_dir=log_dir, run_id=first.run_id) as resumed:
        resumed.log({"a/x": 2.0}, step=1)
    assert resumed.run_id == first.run_id
    assert "resuming run" in capsys.readouterr().out
    assert [r["a/x"] for r in read_jsonl(os.path.join(log_dir, "metrics.jsonl"))] == [1.0, 2.0]
    with make_tracker("stdout", exp_name="e", log_dir=log_dir) as fresh:
        fresh.log({"a/x": 3.0}, step=0)
    assert fresh.run_id != first.run_id
    assert [r["a/x"] for r in read_jsonl(os.path.join(log_dir, "metrics.jsonl"))] == [3.0]


def test_bad_metric_values_and_reserved_keys_raise(tmp_path) -> None:
    with make_tracker("stdout", exp_name="e", log_dir=str(tmp_path)) as tracker:
        with pytest.raises(TypeError, match=r"metric 'a/list' has value \[1, 2\]"):
            tracker.log({"a/list": [1, 2]}, step=0)
        with pytest.raises(TypeError, match="not a scalar"):
            tracker.log({"a/text": "high"}, step=0)
        with pytest.raises(ValueError, match=r"\['step'\] are reserved"):
            tracker.log({"step": 1.0}, step=0)
    assert read_jsonl(str(tmp_path / "metrics.jsonl")) == []


def test_unknown_tracker_lists_valid_names(tmp_path) -> None:
    with pytest.raises(
        ValueError, match=r"unknown tracker 'mlflow'; valid names: \['stdout', (.*, )?'tensorboard', 'wandb'\]"
    ):
        make_tracker("mlflow", exp_name="e", log_dir=str(tmp_path))


def test_unknown_tracker_kwargs_list_accepted_keys(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"\['project'\] are not accepted by tracker 'tensorboard'.*'flush_secs'"):
        make_tracker("tensorboard", exp_name="e", log_dir=str(tmp_path), tracker_kwargs={"project": "p"})
    assert not os.listdir(tmp_path)  # nothing was created before the check


def test_registry_rejects_duplicates_and_non_trackers() -> None:
    @register_tracker("null_test")
    class NullTracker(StdoutTracker):
        """A StdoutTracker under another name."""

    try:
        assert base.get_tracker_class("null_test") is NullTracker
        assert "null_test" in base.list_trackers()
        with pytest.raises(ValueError, match=r"'stdout' is already registered \(by <class '.*\.StdoutTracker'>\)"):
            register_tracker("stdout")(NullTracker)
        with pytest.raises(TypeError, match=r"register_tracker\('thing'\) needs a Tracker subclass"):
            register_tracker("thing")(dict)  # type: ignore[arg-type]
        assert base.get_tracker_class("stdout") is StdoutTracker and "thing" not in base.list_trackers()
        assert issubclass(NullTracker.options_cls, TrackerOptions) and issubclass(NullTracker, Tracker)
    finally:
        base.TRACKERS.unregister("null_test")
    assert "null_test" not in base.list_trackers()


def test_tensorboard_writes_readable_events(tmp_path, capsys) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir, event_dir = str(tmp_path / "logs"), str(tmp_path / "tb")
    tracker = make_tracker(
        "tensorboard", exp_name="e", log_dir=log_dir, config={"lr": 0.001}, tracker_kwargs={"log_dir": event_dir}
    )
    for step in range(3):
        tracker.log({"rollout/success_rate": 0.25 * step, "actor/pg_loss": torch.tensor(1.0 - step)}, step=step)
    tracker.log_text("rollout/sample", "####\n#P.#", step=2)
    tracker.finish()
    acc = EventAccumulator(event_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["actor/pg_loss", "rollout/success_rate"]
    events = acc.Scalars("rollout/success_rate")
    assert [(e.step, e.value) for e in events] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [e.value for e in acc.Scalars("actor/pg_loss")] == [1.0, 0.0, -1.0]
    text_tags = acc.Tags()["tensors"]
    assert "rollout/sample/text_summary" in text_tags and "config/text_summary" in text_tags
    sample = acc.Tensors("rollout/sample/text_summary")[0]
    assert sample.step == 2 and b"#P.#" in sample.tensor_proto.string_val[0]
    assert [r["rollout/success_rate"] for r in read_jsonl(os.path.join(log_dir, "metrics.jsonl"))] == [0.0, 0.25, 0.5]
    assert not glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))  # events went to the override dir
    assert "step 2 | rollout/success_rate 0.5 | actor/pg_loss -1" in capsys.readouterr().out


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """The wandb module in offline mode, with its config/cache dirs under tmp_path; skips if not installed."""
    wandb = pytest.importorskip("wandb", reason="wandb is not installed; the W&B tracker is optional")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    return wandb


def test_wandb_offline_writes_run_dir_and_resumes(offline_wandb, tmp_path, capsys) -> None:
    log_dir = str(tmp_path / "logs")
    kwargs = {"project": "roll-test", "tags": ["cpu"]}
    tracker = make_tracker("wandb", exp_name="e", log_dir=log_dir, config={"lr": 0.001}, tracker_kwargs=kwargs)
    tracker.log({"rollout/success_rate": 0.5}, step=0)
    tracker.log_text("rollout/sample", "<b>#</b>", step=0)
    tracker.finish()
    tracker.finish()  # idempotent
    run_id = tracker.run_id
    run_dirs = glob.glob(os.path.join(log_dir, "wandb", f"offline-run-*-{run_id}"))
    assert len(run_dirs) == 1
    assert os.path.getsize(os.path.join(run_dirs[0], f"run-{run_id}.wandb")) > 0
    assert f"tracking: starting run {run_id} of 'e'" in capsys.readouterr().out

    resumed = make_tracker("wandb", exp_name="e", log_dir=log_dir, tracker_kwargs=kwargs, run_id=run_id)
    resumed.log({"rollout/success_rate": 0.75}, step=1)
    resumed.finish()
    assert resumed.run_id == run_id
    assert [r["rollout/success_rate"] for r in read_jsonl(os.path.join(log_dir, "metrics.jsonl"))] == [0.5, 0.75]


def test_dataclass_config_and_omegaconf_kwargs(tmp_path, capsys) -> None:
    import dataclasses

    from omegaconf import OmegaConf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    @dataclasses.dataclass
    class Cfg:
        lr: float = 0.001
        tags: list = dataclasses.field(default_factory=lambda: ["a"])

    kwargs = OmegaConf.create({"headline_keys": ["b/x"], "flush_secs": "${n}", "n": 5})
    with pytest.raises(ValueError, match=r"\['n'\] are not accepted"):
        make_tracker("tensorboard", exp_name="e", log_dir=str(tmp_path), config=Cfg(), tracker_kwargs=kwargs)
    kwargs = OmegaConf.create({"tb": {"headline_keys": ["b/x"], "flush_secs": "${n}"}, "n": 5}).tb
    with make_tracker("tensorboard", exp_name="e", log_dir=str(tmp_path), config=Cfg(), tracker_kwargs=kwargs) as t:
        t.log({"a/z": 1.0, "b/x": 2.0}, step=0)
    assert t.options.flush_secs == 5 and type(t.options.headline_keys) is list
    assert capsys.readouterr().out.splitlines()[-1] == "step 0 | b/x 2 | a/z 1"
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    config_text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"lr": 0.001' in config_text and '"a"' in config_text
    with pytest.raises(TypeError, match="config must be a dict, a dataclass or an OmegaConf DictConfig, got list"):
        make_tracker("stdout", exp_name="e", log_dir=str(tmp_path), config=[1, 2])


def test_option_values_are_checked(tmp_path) -> None:
    with pytest.raises(
        ValueError, match=r"mode='offlin' is not a W&B mode; use one of \['online', 'offline', 'disabled'\]"
    ):
        make_tracker("wandb", exp_name="e", log_dir=str(tmp_path), tracker_kwargs={"mode": "offlin"})
    with pytest.raises(ValueError, match="flush_secs=0 must be a positive integer"):
        make_tracker("tensorboard", exp_name="e", log_dir=str(tmp_path), tracker_kwargs={"flush_secs": 0})
