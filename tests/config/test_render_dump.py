"""render_save_dir: validation episodes replayed with rendering (rgb_array PNGs or ansi text frames)."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from roll.agentic.render_dump import dump_episode, dump_val_renders, pick_render_mode
from roll.config.agentic import AgenticConfig, CustomEnvConfig, EnvManagerConfig
from roll.data.trajectory import Trajectory, Turn
from roll.envs import make_env
from roll.envs.frozen_lake import FrozenLakeTextEnv
from roll.envs.sokoban.env import SokobanEnv

SOKOBAN = {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 10, "max_solution_length": 8}


def played(env_type: str, kwargs: dict, seed: int, replies: list[str], tag: str) -> Trajectory:
    """Play ``replies`` in a fresh env the way the env manager does, recording rewards."""
    env = make_env(env_type, kwargs)
    obs, _ = env.reset(seed=seed)
    traj = Trajectory(f"val-0-g0-e0-t0-{tag}", env_id=0, group_id=0, tag=tag, seed=seed)
    for reply in replies:
        next_obs, reward, terminated, truncated, info = env.step(reply)
        traj.turns.append(
            Turn([], [], [], obs, response_text=reply, parsed_action=info.get("parsed_action"), reward=float(reward))
        )
        obs = next_obs
        if terminated or truncated:
            break
    return traj


def test_render_modes():
    assert pick_render_mode(SokobanEnv) == "rgb_array"
    assert pick_render_mode(FrozenLakeTextEnv) in ("rgb_array", "ansi")


def test_sokoban_solution_replayed_as_pngs(tmp_path):
    probe = make_env("sokoban", SOKOBAN)
    probe.reset(seed=3)
    solution = probe.solution()
    replies = ["<answer>nonsense</answer>"] + [f"<answer>{a}</answer>" for a in solution]
    traj = played("sokoban", SOKOBAN, 3, replies, "SimpleSokoban")
    frames = dump_episode(traj, "sokoban", SOKOBAN, tmp_path)
    assert frames == len(traj.turns) + 1
    info = json.loads((tmp_path / "episode.json").read_text())
    assert info["replay_consistent"] and info["render_mode"] == "rgb_array" and info["seed"] == 3
    first, second = (np.asarray(Image.open(tmp_path / f"frame_{k:03d}.png")) for k in (0, 1))
    assert first.ndim == 3 and first.shape[2] == 3 and first.dtype == np.uint8
    assert (first == second).all()  # the invalid first action leaves the room unchanged
    last = np.asarray(Image.open(tmp_path / f"frame_{frames - 1:03d}.png"))
    assert not (last == first).all()


def test_dump_val_renders_layout_and_off_switch(tmp_path):
    cfg = AgenticConfig(
        custom_envs={"S": CustomEnvConfig(env_type="sokoban", env_config=dict(SOKOBAN))},
        val_env_manager=EnvManagerConfig(tags=["S"]),
    )
    traj = played("sokoban", {**SOKOBAN, "format_penalty": -0.1}, 5, ["<answer>Up</answer>"], "S")
    assert dump_val_renders(cfg, [traj], 7) == 0  # render_save_dir unset: nothing written
    cfg.render_save_dir = str(tmp_path)
    assert dump_val_renders(cfg, [traj], 7) == 2
    assert sorted(p.name for p in (tmp_path / "step_00007" / traj.traj_id).iterdir()) == [
        "episode.json",
        "frame_000.png",
        "frame_001.png",
    ]


def test_env_kwargs_put_the_managers_values_under_the_tags_env_config():
    spec = CustomEnvConfig(env_type="sokoban", env_config={"dim_room": [6, 6], "action_format": "bare"})
    assert spec.env_kwargs(-0.1, "answer_tags") == {
        "format_penalty": -0.1,
        "action_format": "bare",  # the tag's own env_config wins over the manager's
        "dim_room": [6, 6],
    }
