"""Observation frames in trajectory dumps (vision-language envs): PNG files beside the dump, read back pixel for
pixel; the per-episode and per-frame bounds (kept evenly, downscaled, dropped, each counted); text dumps without a
trace of frames; image parts of a harness's messages as markers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from roll.data.trajectory import Trajectory, Turn
from roll.tracking.dumps import TrajectoryDumps
from roll.tracking.frames import FrameBudget, FrameWriter, kept_indices

#: The keys of a text record and of its turns, as dumps wrote them before frames existed (validation, no batch).
TEXT_RECORD_KEYS = {
    "id",
    "group",
    "env",
    "tag",
    "case",
    "seed",
    "score",
    "success",
    "failure",
    "truncated",
    "metrics",
    "turns",
    "final_observation",
}
TEXT_TURN_KEYS = {"prompt", "observation", "response", "action", "valid", "reward", "finish", "tokens", "mask", "logp"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def frame(height: int, width: int, seed: int, noise: bool = False) -> np.ndarray:
    """An H x W x 3 uint8 frame: random noise (incompressible), or blocks of a few colors (compresses well)."""
    rng = np.random.default_rng(seed)
    if noise:
        return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    colors = rng.integers(0, 256, (4, 3), dtype=np.uint8)
    ys, xs = np.indices((height, width))
    return colors[(ys // 8 + xs // 8) % 4]


def episode(frames_per_turn: list[list[Any]], traj_id: str = "val-1-g0-e0-t0") -> Trajectory:
    turns = [
        Turn(
            prompt_ids=[10 + k, 11, 12],
            response_ids=[20, 21, 22],
            response_log_probs=[-0.5] * 3,
            observation=f"obs {k}",
            response_text="<answer>Up</answer>",
            parsed_action="Up",
            action_is_valid=True,
            images=list(images),
        )
        for k, images in enumerate(frames_per_turn)
    ]
    return Trajectory(traj_id, 0, 0, "VisualSokoban", 3, turns=turns)


def dump(tmp_path: Path, trajs: list[Trajectory], budget: FrameBudget | None, tokenizer: Any) -> tuple[Path, list]:
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "agentic", frames=budget).agentic("val", 1, trajs)
    assert path is not None
    return path, [json.loads(line) for line in path.read_text().splitlines()]


def test_frames_are_pngs_beside_the_dump_pixel_for_pixel(tmp_path, tokenizer) -> None:
    shown = [[frame(48, 64, 0)], [frame(48, 64, 1), frame(24, 24, 2)], []]
    path, (record,) = dump(tmp_path, [episode(shown)], FrameBudget(max_frames=16, max_kib=64), tokenizer)
    assert record["frame_counts"] == {"seen": 3, "kept": 3, "downscaled": 0, "dropped": 0}
    assert "frames" not in record["turns"][2]  # a turn without images has no frames key
    for k, turn in enumerate(record["turns"][:2]):
        assert len(turn["frames"]) == len(shown[k])
        for entry, array in zip(turn["frames"], shown[k]):
            assert entry["src"].startswith("step_00001_frames/val-1-g0-e0-t0/")
            with Image.open(path.parent / entry["src"]) as png:
                assert png.format == "PNG" and png.size == (entry["width"], entry["height"]) == array.shape[1::-1]
                assert np.array_equal(np.asarray(png.convert("RGB")), array)  # lossless
    # a second dump of the same step replaces the first one's frames
    dump(tmp_path, [episode([[frame(8, 8, 5)]])], FrameBudget(16, 64), tokenizer)
    assert sorted(p.name for p in (path.parent / "step_00001_frames").rglob("*.png")) == ["t01_0.png"]


def test_a_text_episode_dumps_as_before(tmp_path, tokenizer) -> None:
    path, (record,) = dump(tmp_path, [episode([[], []])], FrameBudget(16, 64), tokenizer)
    assert set(record) == TEXT_RECORD_KEYS
    assert all(set(turn) == TEXT_TURN_KEYS for turn in record["turns"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["step_00001.jsonl"]  # no frames folder


def test_frames_over_the_episode_bound_are_thinned_evenly_and_counted(tmp_path, tokenizer) -> None:
    shown = [[frame(16, 16, k)] for k in range(10)]
    _, (record,) = dump(tmp_path, [episode(shown)], FrameBudget(max_frames=4, max_kib=64), tokenizer)
    kept = [k for k, turn in enumerate(record["turns"]) if "src" in turn["frames"][0]]
    assert kept == kept_indices(10, 4) == [0, 3, 6, 9]  # the first and the last frame always
    assert record["frame_counts"] == {"seen": 10, "kept": 4, "downscaled": 0, "dropped": 6}
    note = record["turns"][1]["frames"][0]
    assert note == {
        "dropped": "over the limit of 4 frames per episode (trajectory_dump_frames)",
        "source_size": [16, 16],
    }
    _, (none,) = dump(tmp_path, [episode(shown[:2])], FrameBudget(max_frames=0, max_kib=64), tokenizer)
    assert none["frame_counts"] == {"seen": 2, "kept": 0, "downscaled": 0, "dropped": 2}


def test_a_frame_over_the_size_bound_is_downscaled_or_dropped(tmp_path, tokenizer) -> None:
    big = frame(192, 256, 0, noise=True)  # ~144 KiB of noise: no PNG makes it small
    strip = frame(8, 4000, 1, noise=True)  # its short side is at the 8 px floor already: it cannot shrink
    path, (record,) = dump(
        tmp_path, [episode([[big], [strip], [frame(32, 32, 2)]])], FrameBudget(16, max_kib=16), tokenizer
    )
    scaled, dropped, small = (turn["frames"][0] for turn in record["turns"])
    assert (path.parent / scaled["src"]).stat().st_size <= 16 * 1024
    assert scaled["source_size"] == [256, 192] and scaled["width"] < 256 and scaled["height"] < 192
    assert abs(scaled["width"] / scaled["height"] - 256 / 192) < 0.05  # aspect ratio kept
    with Image.open(path.parent / scaled["src"]) as png:
        assert png.size == (scaled["width"], scaled["height"])
    assert dropped == {"dropped": "over 16 KiB even at 8 px (trajectory_dump_frame_kib)", "source_size": [4000, 8]}
    assert "source_size" not in small and (small["width"], small["height"]) == (32, 32)
    assert record["frame_counts"] == {"seen": 3, "kept": 2, "downscaled": 1, "dropped": 1}


def test_frames_that_are_not_images_are_dropped_with_the_reason(tmp_path, tokenizer) -> None:
    floats = np.zeros((8, 8, 3), dtype=np.float32)
    _, (record,) = dump(
        tmp_path, [episode([[floats, Image.new("RGB", (12, 10), "red")]])], FrameBudget(16, 64), tokenizer
    )
    bad, pil = record["turns"][0]["frames"]
    assert bad["dropped"].startswith("a frame must be a PIL image or an H x W x 3 uint8 array, got ndarray")
    assert "dtype=float32" in bad["dropped"] and (pil["width"], pil["height"]) == (12, 10)
    # without a budget (a dump made without one) frames are counted, never written
    _, (bare,) = dump(tmp_path / "bare", [episode([[frame(8, 8, 0)]])], None, tokenizer)
    assert bare["frame_counts"]["dropped"] == 1 and not (tmp_path / "bare/trajectories/val/step_00001_frames").exists()


def test_image_parts_of_harness_messages_are_markers(tmp_path, tokenizer) -> None:
    traj = episode([[frame(8, 8, 0)]])
    traj.tag = "Looker"
    url = "data:image/png;base64,iVBORw0KGgo="
    parts = [{"type": "text", "text": "What is here? "}, {"type": "image_url", "image_url": {"url": url}}]
    traj.messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": "a box"}]
    envs = {"Looker": {"env_type": None, "agent_runner": "my.looker", "grid_symbols": None}}
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "agentic", envs, FrameBudget(16, 64)).agentic("val", 1, [traj])
    assert path is not None
    record = json.loads(path.read_text())
    assert record["messages"] == [
        {"role": "user", "content": "What is here? [image]"},
        {"role": "assistant", "content": "a box"},
    ]
    assert url not in path.read_text()


def test_budget_is_checked() -> None:
    with pytest.raises(ValueError, match="max_frames must be >= 0 and max_kib >= 1"):
        FrameBudget(max_frames=4, max_kib=0)
    assert FrameWriter(Path("/nonexistent/x"), None).episode("t", [[], []]) == ([[], []], {})


def test_a_rollout_of_an_env_that_sees_dumps_the_frames_the_env_showed(tmp_path, tiny_vl_model_dir) -> None:
    """roll's env manager plays Sokoban in rgb_array mode for a vision-language actor (replies scripted); the dump's
    PNGs are, pixel for pixel, the frames a replay of each episode shows before each reply."""
    from roll.agentic.env_manager import EnvManager, plan_groups
    from roll.config.agentic import CustomEnvConfig, EnvManagerConfig
    from roll.config.worker import GeneratingArgs
    from roll.envs import make_env
    from tests.agentic.gateway_parts import TextEngine

    env_config = {"dim_room": [6, 6], "render_mode": "rgb_array", "tile_pixels": 4, "max_steps": 10}
    envs = {"SokobanVL": CustomEnvConfig(env_type="sokoban", env_config=env_config, max_actions_per_traj=3)}
    block = EnvManagerConfig(tags=["SokobanVL"], env_groups=1, group_size=2)
    manager = EnvManager(
        block, plan_groups(block, envs), tiny_vl_model_dir, GeneratingArgs(max_new_tokens=8), 1024, 3, "val"
    )
    trajs = manager.rollout(
        1, TextEngine(manager.tokenizer, ["<answer>Up</answer>", "<answer>Left</answer>"])
    ).trajectories
    dumps = TrajectoryDumps(tmp_path, 1, 0, manager.tokenizer, "agentic", frames=FrameBudget(16, 64))
    path = dumps.agentic("val", 1, trajs)
    assert path is not None
    moved = 0  # turns whose frame differs from the one before (so an off-by-one turn would fail)
    for traj, record in zip(trajs, (json.loads(line) for line in path.read_text().splitlines())):
        replay = make_env("sokoban", {"format_penalty": block.format_penalty, **env_config})
        shown, _ = replay.reset(seed=traj.seed)
        assert record["frame_counts"] == {
            "seen": len(traj.turns),
            "kept": len(traj.turns),
            "downscaled": 0,
            "dropped": 0,
        }
        dumped: list[np.ndarray] = []
        for turn, entry in zip(traj.turns, record["turns"]):
            (frame,) = entry["frames"]
            with Image.open(path.parent / frame["src"]) as png:
                dumped.append(np.asarray(png.convert("RGB")))
            assert np.array_equal(dumped[-1], shown.images[0])
            shown, *_ = replay.step(turn.response_text)
        moved += sum(not np.array_equal(a, b) for a, b in zip(dumped, dumped[1:]))
    assert moved >= 1
