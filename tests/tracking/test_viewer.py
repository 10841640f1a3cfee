"""``roll view`` without a browser: where it finds a run, what it writes (assets, data scripts, dashboard), the
steps table and charts it derives from metrics.jsonl, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.data.trajectory import Trajectory, Turn
from roll.launch.cli import main as roll_main
from roll.tracking import make_tracker
from roll.tracking.dumps import TrajectoryDumps
from roll.tracking.viewer import build_viewer, find_run
from roll.tracking.viewer.build import ASSET_FILES


class CharTokenizer:
    """Decodes ids as characters (enough for dumps; the token alignment itself is tested in test_dumps.py)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)

    def batch_decode(self, seqs, skip_special_tokens=False):
        return [self.decode(s) for s in seqs]


def trajectory(step: int, group: int, env: int) -> Trajectory:
    turn = Turn(
        prompt_ids=[35, 80],
        response_ids=[85, 112],
        response_log_probs=[-0.1, -0.2],
        observation="#P\n_O",
        response_text="Up",
        parsed_action="Up",
        action_is_valid=True,
        reward=1.0 if env == 0 else -0.1,
    )
    return Trajectory(
        f"train-{step}-g{group}-e{env}-t0",
        env,
        group,
        "SimpleSokoban",
        seed=100 + group,
        turns=[turn],
        success=env == 0,
        final_observation="#_\n_S",
    )


def write_run(log_dir: Path, steps: int = 4) -> Path:
    """metrics.jsonl from a real tracker and train/val dumps every 2 steps (2 groups x 2 envs)."""
    dumps = TrajectoryDumps(
        log_dir,
        every=2,
        cap=0,
        tokenizer=CharTokenizer(),
        pipeline="agentic",
        envs={"SimpleSokoban": {"env_type": "sokoban", "grid_symbols": {"#": "wall"}}},
    )
    with make_tracker("stdout", exp_name="v", log_dir=str(log_dir)) as tracker:
        for step in range(steps + 1):
            if step:
                tracker.log(
                    {
                        "rollout/success_rate": step / 10,
                        "rollout/mean_reward": step / 5,
                        "time/step": 2.0,
                        "time/rollout": 1.0 + step % 2,
                        "rollout/invalid_action_rate": 0.0,
                    },
                    step,
                )
                dumps.agentic("train", step, [trajectory(step, g, e) for g in range(2) for e in range(2)])
            if step % 2 == 0:
                tracker.log({"val/success_rate": 0.2 + step / 20}, step)
                dumps.agentic("val", step, [trajectory(step, g, 0) for g in range(3)])
    return log_dir


def read_script(path: Path) -> object:
    """The JSON value a data script assigns."""
    text = path.read_text()
    return json.loads(text[text.index("=", text.index("]") if text.startswith("(") else 0) + 1 :].strip().rstrip(";"))


def test_find_run_from_output_dir_logs_dir_dump_folder_and_file(tmp_path) -> None:
    logs = write_run(tmp_path / "run" / "logs")
    for source in (tmp_path / "run", logs, logs / "trajectories"):
        run = find_run(source)
        assert run.log_dir == logs and run.metrics == logs / "metrics.jsonl"
        assert [(p, s) for p, s, _ in run.dumps] == [("val", 0), ("train", 2), ("val", 2), ("train", 4), ("val", 4)]
        assert run.meta["pipeline"] == "agentic"
    one = find_run(logs / "trajectories" / "val" / "step_00002.jsonl")
    assert [(p, s) for p, s, _ in one.dumps] == [("val", 2)] and one.log_dir == logs
    with pytest.raises(FileNotFoundError, match="no trajectories/ folder or metrics.jsonl"):
        find_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        find_run(tmp_path / "missing")


def test_build_writes_assets_data_and_dashboard(tmp_path) -> None:
    logs = write_run(tmp_path / "run" / "logs")
    index = build_viewer(tmp_path / "run")
    out = logs / "viewer"
    assert index == out / "index.html"
    assert all((out / name).is_file() for name in ASSET_FILES) and (out / "dashboard.png").stat().st_size > 5000
    html = index.read_text()
    assert "http" not in html.replace("http://www.w3.org", "")  # nothing fetched from the network
    run = read_script(out / "data" / "run.js")
    assert run["title"] == "run" and run["pipeline"] == "agentic"
    assert [c["key"] for c in run["columns"]] == [
        "rollout/success_rate",
        "val/success_rate",
        "rollout/mean_reward",
        "rollout/invalid_action_rate",
        "time/step",
    ]
    assert [s["step"] for s in run["steps"]] == [0, 1, 2, 3, 4]
    assert run["steps"][2]["values"] == pytest.approx(
        {
            "rollout/success_rate": 0.2,
            "val/success_rate": 0.3,
            "rollout/mean_reward": 0.4,
            "rollout/invalid_action_rate": 0.0,
            "time/step": 2.0,
        }
    )
    assert [c["title"] for c in run["charts"]] == ["success rate", "mean reward"]
    assert [s for s, _ in run["charts"][0]["val"]] == [0, 2, 4]
    assert [v for _, v in run["charts"][0]["val"]] == pytest.approx([0.2, 0.3, 0.4])
    assert run["notes"] == ["rollout/invalid_action_rate = 0"]
    assert [(d["phase"], d["step"], d["count"], d["groups"], d["success"]) for d in run["dumps"]][:2] == [
        ("val", 0, 3, 3, 1.0),
        ("train", 2, 4, 2, 0.5),
    ]
    records = read_script(out / "data" / "train_00002.js")
    assert [r["id"] for r in records] == [f"train-2-g{g}-e{e}-t0" for g in range(2) for e in range(2)]
    assert records[0]["turns"][0]["tokens"] == ["U", "p"] and records[0]["final_observation"] == "#_\n_S"


def test_rebuild_drops_stale_data_and_single_file_builds_beside_it(tmp_path) -> None:
    logs = write_run(tmp_path / "logs")
    build_viewer(logs)
    (logs / "trajectories" / "train" / "step_00004.jsonl").unlink()
    build_viewer(logs)
    assert not (logs / "viewer" / "data" / "train_00004.js").exists()
    dump = logs / "trajectories" / "val" / "step_00004.jsonl"
    index = build_viewer(dump, title="one file")
    assert index == dump.with_name("step_00004_viewer") / "index.html"
    assert sorted(p.name for p in (index.parent / "data").iterdir()) == ["run.js", "val_00004.js"]
    assert read_script(index.parent / "data" / "run.js")["title"] == "one file"


def test_cli(tmp_path, capsys) -> None:
    logs = write_run(tmp_path / "logs")
    capsys.readouterr()
    assert roll_main(["view", str(logs), "-o", str(tmp_path / "site")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"wrote {tmp_path / 'site' / 'index.html'}",
        f"open it in a browser: {(tmp_path / 'site' / 'index.html').as_uri()}",
    ]
    assert roll_main(["view", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith(f"roll view: {tmp_path / 'nowhere'}: no such file or directory")


def test_health_and_the_levels_to_beat_reach_the_viewer(tmp_path) -> None:
    """The run-health events (health.jsonl, written by the real check), the alert steps on every chart, the health
    column, and the warm start's and the SFT control's levels on the success chart."""
    from tests.tracking.test_tracking_plot import health_run

    logs = Path(health_run(tmp_path)).parent
    build_viewer(logs.parent)
    run = read_script(logs / "viewer" / "data" / "run.js")
    health = run["health"]
    assert health["checked"] and health["note"] == "run health: approx_kl at steps 6-7"
    assert [(e["step"], e["rule"], e["event"]) for e in health["events"]] == [
        (6, "approx_kl", "fired"),
        (8, "approx_kl", "recovered"),
    ]
    assert health["events"][0]["line"].startswith("[roll] health: step 6: actor/approx_kl 0.1 > 0.05 for 3 steps")
    success = run["charts"][0]
    assert success["refs"] == [
        {"label": "warm start (step 0)", "value": 0.5},
        {"label": "SFT control, same time", "value": 0.52},
    ]
    assert all(chart["alerts"] == [[6, ["approx_kl"]], [7, ["approx_kl"]]] for chart in run["charts"])
    assert run["columns"][-1]["key"] == "health/alerts"
    assert [s["values"]["health/alerts"] for s in run["steps"]] == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    # a run from before the health check: no card, no alerts
    old = read_script(build_viewer(write_run(tmp_path / "old" / "logs")).parent / "data" / "run.js")
    assert old["health"] == {"checked": False, "note": None, "events": []}
    assert "alerts" not in old["charts"][0] and old["charts"][0]["refs"] == [{"label": "step 0", "value": 0.2}]
