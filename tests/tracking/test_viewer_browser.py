"""The trajectory viewer in a real headless browser (Debian's Chromium driven by Playwright), built by ``roll view``
from short real runs of both pipelines: click through a step, a group, a trajectory and the validation rooms, and
check what is shown against the dump files. Screenshots go to ``output/test-artifacts/``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from roll.launch.cli import main as roll_main

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run_pipeline(script: str, config: str, tmp: Path, overrides: list[str]) -> Path:
    """Run a start script in-process mode (no Ray) and return its logging_dir."""
    cmd = [
        sys.executable,
        str(REPO / "examples" / script),
        "--config-name",
        config,
        f"output_dir={tmp}/out",
        f"logging_dir={tmp}/logs",
        "distributed=local",
        "save_steps=0",
        "track_with=stdout",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "logs"


def read_dump(log_dir: Path, phase: str, step: int) -> list[dict]:
    path = log_dir / "trajectories" / phase / f"step_{step:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def build(log_dir: Path, capsys) -> Path:
    assert roll_main(["view", str(log_dir.parent)]) == 0  # the run's output_dir: its logs/ are found
    index = log_dir / "viewer" / "index.html"
    assert capsys.readouterr().out.startswith(f"wrote {index}")
    return index


@pytest.fixture(scope="module")
def sokoban_logs(tmp_path_factory, tiny_model_dir) -> Path:
    """2 RL steps of 2 groups x 4 envs after a short warm start; validation on 4 rooms at steps 0, 1 and 2."""
    return run_pipeline(
        "start_agentic_pipeline.py",
        "sokoban_tiny",
        tmp_path_factory.mktemp("sokoban"),
        [
            f"pretrain={tiny_model_dir}",
            "max_steps=2",
            "eval_steps=1",
            "trajectory_dump_steps=1",
            "sft_warmup.steps=4",
            "sft_warmup.batch_size=8",
            "sft_warmup.num_demos=64",
            "rollout_batch_size=8",
            "train_env_manager.env_groups=2",
            "train_env_manager.group_size=4",
            "val_env_manager.env_groups=4",
            "custom_envs.SimpleSokoban.max_actions_per_traj=4",
            "sequence_length=512",
        ],
    )


@pytest.fixture(scope="module")
def rlvr_logs(tmp_path_factory, tiny_model_dir) -> Path:
    """1 RL step on 2 prompts x 4 responses; greedy validation on 4 prompts at steps 0 and 1."""
    return run_pipeline(
        "start_rlvr_pipeline.py",
        "rlvr_tiny",
        tmp_path_factory.mktemp("rlvr"),
        [
            f"pretrain={tiny_model_dir}",
            "tiny_model=null",
            "max_steps=1",
            "eval_steps=1",
            "rollout_dump_steps=1",
            "sft_warmup.steps=2",
            "sft_warmup.batch_size=8",
            "rollout_batch_size=2",
            "num_return_sequences_in_group=4",
            "max_additional_running_prompts=2",
            "validation.max_samples=4",
            "rewards.num_workers=1",
        ],
    )


def texts(page, selector: str) -> list[str]:
    return page.locator(selector).all_inner_texts()


def test_sokoban_run_in_browser(sokoban_logs, capsys, open_page, screenshot) -> None:
    index = build(sokoban_logs, capsys)
    page = open_page(index)

    # overview: one table row per logged step (0 = warm start and first validation), the dashboard image, the chart
    page.wait_for_selector("#steps-table")
    assert [t.split("\t")[0] for t in texts(page, "#steps-table tbody tr")] == ["0", "1", "2"]
    assert page.eval_on_selector("#dashboard", "img => img.complete && img.naturalWidth > 600")
    assert page.locator("svg.chart polyline.val").count() == 1
    # run health: two steps are too few for any rule to fire
    assert page.locator("#health-note").inner_text() == "run health: no rule left its healthy range"
    screenshot(page, "viewer-overview")
    charts = page.eval_on_selector("#chart-pick", "s => [...s.options].map(o => o.text)")
    if "success rate" in charts:  # drawn when success varied (test_health_alerts_and_levels_in_browser always has it)
        page.select_option("#chart-pick", label="success rate")
        assert page.locator("svg.chart line.ref").count() == 1  # the warm start's level
        assert "warm start (step 0): " in page.locator(".chart-legend").inner_text()

    # a training step: groups and trajectories as in the dump file
    records = read_dump(sokoban_logs, "train", 1)
    page.get_by_role("link", name="train step 1").first.click()
    page.wait_for_selector("#groups")
    assert page.locator("section.group").count() == len({r["group"] for r in records}) == 2
    assert page.locator("tr.traj-row").count() == len(records) == 8
    assert page.locator("section.group .board").count() == 2  # each group's start room drawn as a board
    for outcome, wanted in (("Success", True), ("Failure", False)):
        page.get_by_role("button", name=outcome).click()
        shown = page.locator("tr.traj-row").evaluate_all("rows => rows.map(r => r.dataset.id)")
        assert sorted(shown) == sorted(r["id"] for r in records if r["success"] == wanted)
    failed = [r["id"] for r in records if r.get("failure")]  # episodes whose env raised or timed out
    page.get_by_role("button", name=f"Error ({len(failed)})", exact=True).click()
    assert page.locator("tr.traj-row").evaluate_all("rows => rows.map(r => r.dataset.id)") == failed
    page.get_by_role("button", name="All").click()
    page.select_option("#sort-pick", "score-desc")
    first_group = page.locator("section.group").first
    scores = [
        float(s)
        for s in first_group.locator("tr.traj-row td.num").evaluate_all(
            "cells => cells.filter((c, i) => i % 2 === 0).map(c => c.textContent)"
        )
    ]
    assert scores == sorted(scores, reverse=True)
    screenshot(page, "viewer-step")

    # a trajectory: its turns, every reply token with its advantage, the masked tokens, the boards
    page.locator("tr.traj-row a").first.click()
    page.wait_for_selector("#turns")
    traj_id = page.locator("h1 code").inner_text()
    record = next(r for r in records if r["id"] == traj_id)
    assert page.locator("section.turn:not(.end)").count() == len(record["turns"])
    for k, turn in enumerate(record["turns"]):
        tokens = page.locator(f"section.turn[data-turn='{k}'] .tok")
        assert tokens.all_text_contents() == [t.replace("\n", "↵\n") for t in turn["tokens"]]
        assert [float(a) for a in tokens.evaluate_all("ts => ts.map(t => t.dataset.adv)")] == turn["adv"]
        assert tokens.evaluate_all("ts => ts.map(t => Number(t.dataset.mask))") == turn["mask"]
    rows = record["turns"][0]["observation"].splitlines()
    assert page.locator("section.turn[data-turn='0'] .board .cell").count() == len(rows) * len(rows[0])
    assert page.locator("section.turn.end .board").count() == 1  # the state the episode ended in
    screenshot(page, "viewer-trajectory")
    page.get_by_role("button", name="probability").click()
    assert "how unlikely the sampled token was" in page.locator("p.legend").first.inner_text()

    # validation: the same 4 rooms at steps 0, 1, 2; one room side by side across steps
    page.get_by_role("link", name="Validation", exact=True).click()
    page.wait_for_selector("#val-matrix")
    assert texts(page, "#val-matrix thead tr:first-child th")[2:] == ["step 0", "step 1", "step 2"]
    cases = [r["case"] for r in read_dump(sokoban_logs, "val", 0)]
    assert page.locator("#val-matrix tbody tr").evaluate_all("rows => rows.map(r => r.dataset.case)") == cases
    screenshot(page, "viewer-validation")
    page.locator("#val-matrix tbody tr a").first.click()
    page.wait_for_selector("#episodes")
    assert page.locator("#episodes .episode").evaluate_all("es => es.map(e => e.dataset.step)") == ["0", "1", "2"]
    screenshot(page, "viewer-room")


def test_rlvr_run_in_browser(rlvr_logs, capsys, open_page, screenshot) -> None:
    page = open_page(build(rlvr_logs, capsys))
    page.wait_for_selector("#steps-table")
    records = read_dump(rlvr_logs, "train", 1)
    page.get_by_role("link", name="train step 1").first.click()
    page.wait_for_selector("#groups")
    assert page.locator("section.group").count() == 2 and page.locator("tr.traj-row").count() == len(records) == 8
    assert page.locator("section.group code").first.inner_text() == records[0]["ground_truth"]
    page.locator("tr.traj-row a").first.click()
    page.wait_for_selector("#turns")
    (turn,) = records[0]["turns"]
    assert page.locator("section.turn .tok").count() == len(turn["tokens"]) > 0
    assert "prompt: the exact text the model saw" in page.locator("section.turn summary").inner_text()
    screenshot(page, "viewer-rlvr-response")
    page.get_by_role("link", name="Validation", exact=True).click()
    page.wait_for_selector("#val-matrix")
    assert page.locator("#val-matrix tbody tr").count() == 4
    assert texts(page, "#val-matrix thead tr:first-child th")[2:] == ["step 0", "step 1"]


def test_health_alerts_and_levels_in_browser(tmp_path, capsys, open_page, screenshot) -> None:
    """A run where a health rule fired (the real check on a synthetic metric stream) with an SFT control beside it:
    the events table, the triangles on the step axis of each chart, the two levels on the success chart."""
    from tests.tracking.test_tracking_plot import health_run

    logs = Path(health_run(tmp_path)).parent
    capsys.readouterr()  # the trackers' lines
    page = open_page(build(logs, capsys))
    page.wait_for_selector("#health-events")
    assert page.locator("#health-note").inner_text() == "run health: approx_kl at steps 6-7"
    rows = page.locator("#health-events tbody tr")
    assert rows.evaluate_all("rs => rs.map(r => [r.dataset.step, r.dataset.rule, r.className])") == [
        ["6", "approx_kl", "fired"],
        ["8", "approx_kl", "recovered"],
    ]
    assert "the policy moves too far in one update" in rows.first.inner_text()
    assert page.locator("svg.chart line.ref").count() == 2
    legend = page.locator(".chart-legend").inner_text()
    assert "warm start (step 0): 50.0%" in legend and "SFT control, same time: 52.0%" in legend
    assert page.locator("svg.chart polygon.alert").evaluate_all("ps => ps.map(p => p.dataset.step)") == ["6", "7"]
    screenshot(page, "viewer-health")
    page.select_option("#chart-pick", label="approx KL")  # every chart marks the alerts; only success has levels
    assert page.locator("svg.chart polygon.alert").count() == 2 and page.locator("svg.chart line.ref").count() == 0


def test_frames_beside_the_reply_in_browser(tmp_path, capsys, open_page, screenshot, tiny_model_dir) -> None:
    """A dump with a vision-language episode (frames per turn, one over the size bound) and a text episode: each turn
    of the first shows its frames as images left of the reply, at the size the dump kept; the second shows none."""
    from transformers import AutoTokenizer

    from roll.tracking.dumps import TrajectoryDumps
    from roll.tracking.frames import FrameBudget
    from tests.tracking.test_frames import episode, frame

    seen = [[frame(30, 40, 0)], [frame(30, 40, 1), frame(20, 20, 2)], [frame(192, 256, 3, noise=True)]]
    vision, text = episode(seen, "val-1-g0-e0-t0"), episode([[], []], "val-1-g1-e0-t0")
    text.group_id = 1
    dumps = TrajectoryDumps(tmp_path / "logs", 1, 0, AutoTokenizer.from_pretrained(tiny_model_dir), "agentic")
    dumps.frames = FrameBudget(max_frames=16, max_kib=16)
    record = json.loads(dumps.agentic("val", 1, [vision, text]).read_text().splitlines()[0])
    scaled = record["turns"][2]["frames"][0]
    assert scaled["source_size"] == [256, 192] and scaled["width"] < 256  # over 16 KiB: downscaled
    index = build(tmp_path / "logs", capsys)

    page = open_page(f"{index.as_uri()}#/traj/val/1/val-1-g0-e0-t0")
    page.wait_for_selector("#turns section.turn")
    page.wait_for_function("[...document.querySelectorAll('img.frame')].every(i => i.complete && i.naturalWidth)")
    shown = page.locator("section.turn:not(.end)").evaluate_all(
        "cards => cards.map(c => [...c.querySelectorAll('img.frame')].map(i => [i.naturalWidth, i.naturalHeight]))"
    )
    assert shown == [[[40, 30]], [[40, 30], [20, 20]], [[scaled["width"], scaled["height"]]]]
    beside = page.locator("section.turn:not(.end)").evaluate_all(
        "cards => cards.map(c => c.querySelector('img.frame').getBoundingClientRect().right"
        " <= c.querySelector('.reply').getBoundingClientRect().left)"
    )
    assert beside == [True, True, True]
    assert page.locator("#frame-note").inner_text() == (
        "frames: 4 of 4 kept, 1 downscaled (bounds: trajectory_dump_frames, trajectory_dump_frame_kib)"
    )
    assert "downscaled from 256×192" in page.locator("section.turn").nth(2).locator("img.frame").get_attribute("title")
    screenshot(page, "viewer-frames")

    page.goto(f"{index.as_uri()}#/traj/val/1/val-1-g1-e0-t0")
    page.wait_for_selector("#traj-summary")
    page.wait_for_function("document.querySelector('h1 code').textContent === 'val-1-g1-e0-t0'")
    assert page.locator("section.turn").count() == 2
    assert page.locator("img.frame").count() == 0 and page.locator("#frame-note").count() == 0

    page.goto(f"{index.as_uri()}#/step/val/1")  # the step page: a group's start shows its first frame
    page.wait_for_selector("#groups")
    heads = page.locator("section.group .group-head").evaluate_all(
        "hs => hs.map(h => h.querySelectorAll('.frames-sm img.frame').length)"
    )
    assert heads == [1, 0]

    page.goto(f"{index.as_uri()}#/val")  # the validation rooms: a room's start shows its first frame
    page.wait_for_selector("#val-matrix")
    assert page.locator("#val-matrix tbody td .frames-sm img.frame").count() == 1

    page.goto(f"{index.as_uri()}#/case/{quote('VisualSokoban/3', safe='')}")  # a room across validation steps
    page.wait_for_selector("#episodes")
    assert page.locator("#episodes .frames-sm img.frame").count() == 4
