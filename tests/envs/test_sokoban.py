"""Sokoban: generation, solver, rewards, determinism, rendering, check_env."""

import os

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from roll.envs import make_env
from roll.envs.sokoban import Room, SokobanEnv, solve


def act(env, word):
    return env.step(f"<answer>{word}</answer>")


@pytest.mark.parametrize("dim_room", [(5, 5), (6, 6), (7, 7), (8, 8), (6, 8)])
@pytest.mark.parametrize("num_boxes", [1, 2])
def test_generated_rooms_are_solved_by_replaying_the_plan(dim_room, num_boxes):
    env = SokobanEnv(dim_room=dim_room, num_boxes=num_boxes, max_steps=100)
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        assert obs.count("X") == num_boxes and "*" not in obs  # no box starts on a target
        plan = env.solution()
        assert plan is not None and len(plan) == info["optimal_solution_length"] >= 1
        for i, word in enumerate(plan):
            _, _, terminated, truncated, info = act(env, word)
            assert terminated == (i == len(plan) - 1) and not truncated
        assert info["success"] and info["metrics"]["boxes_on_target"] == num_boxes


def test_max_solution_length_and_search_depth_bound_the_plan():
    env = SokobanEnv(dim_room=(7, 7), num_boxes=2, max_solution_length=4, search_depth=30)
    lengths = [len(env.solution()) for seed in range(40) if env.reset(seed=seed)]
    assert max(lengths) <= 4 and min(lengths) >= 1
    env = SokobanEnv(dim_room=(7, 7), num_boxes=1, search_depth=3)
    assert all(len(env.solution()) <= 3 for seed in range(40) if env.reset(seed=seed))


ROOM = """
#######
#P_X_O#
#__X_O#
#######
"""


def test_reward_table_on_a_hand_made_room():
    env = SokobanEnv(max_steps=20)
    obs, info = env.reset(seed=0, options={"room": ROOM})
    assert obs == ROOM.strip() and info["optimal_solution_length"] == 8
    assert act(env, "Up")[1:4] == (-0.1, False, False)  # into a wall: valid, no change
    assert act(env, "right")[1] == -0.1  # walk
    obs, reward, *_ = act(env, "RIGHT")  # push box 1 to (1, 4)
    assert reward == -0.1 and obs.splitlines()[1] == "#__PXO#"
    obs, reward, _, _, info = act(env, "Right")  # box 1 onto the target
    assert reward == pytest.approx(0.9) and info["metrics"]["boxes_on_target"] == 1
    assert obs.splitlines()[1] == "#___P*#"
    obs, reward, terminated, _, info = act(env, "Right")  # two boxes: cannot push box into wall
    assert (reward, terminated) == (-0.1, False)
    obs, reward, terminated, _, info = act(env, "Jump")  # not an answer: format penalty
    assert (reward, info["action_is_valid"], info["metrics"]["invalid_actions"]) == (-0.1, False, 1)


def test_push_off_target_costs_one():
    env = SokobanEnv(max_steps=20)
    env.reset(options={"room": "######\n#P*__#\n######"})  # starts solved; pushing breaks it
    obs, reward, terminated, _, info = act(env, "Right")
    assert reward == pytest.approx(-1.1) and not terminated and obs == "######\n#_SX_#\n######"
    assert info["metrics"]["boxes_on_target"] == 0 and env.solution() is None  # boxes cannot be pulled


def test_solved_bonus():
    env = SokobanEnv()
    env.reset(options={"room": "#####\n#PXO#\n#####"})
    _, reward, terminated, truncated, info = act(env, "Right")
    assert reward == pytest.approx(10.9) and terminated and not truncated and info["success"]


def test_solver_on_hand_made_rooms():
    assert solve(Room.from_text("#####\n#PXO#\n#####")) == ["Right"]
    assert solve(Room.from_text("#####\n#OXP#\n#####")) == ["Left"]
    assert solve(Room.from_text("######\n#P_*_#\n######")) == []
    assert solve(Room.from_text("#####\n#XPO#\n#####")) is None  # box in a corner
    assert solve(Room.from_text("#####\n#_P_#\n#_X_#\n#_O_#\n#####")) == ["Down"]
    assert solve(Room.from_text("######\n#PX__#\n#____#\n#__O_#\n######")) is None  # box stuck on a wall
    # two pushes (Down, Right in either order) and three walks
    text = "######\n#P___#\n#_X__#\n#__O_#\n######"
    plan, room = solve(Room.from_text(text)), Room.from_text(text)
    for word in plan:
        room.move(word)
    assert room.solved and len(plan) == 5


def test_truncation_and_step_after_end():
    env = SokobanEnv(max_steps=2)
    env.reset(seed=5)
    assert act(env, "Up")[3] is False
    assert act(env, "nonsense")[3] is True
    with pytest.raises(RuntimeError, match="reset"):
        act(env, "Up")


def test_determinism_and_seeds_differ():
    a, b = SokobanEnv(), SokobanEnv()
    assert [a.reset(seed=s)[0] for s in range(10)] == [b.reset(seed=s)[0] for s in range(10)]
    assert len({a.reset(seed=s)[0] for s in range(10)}) == 10


def test_show_border_false_drops_outer_ring():
    full, inner = SokobanEnv(), SokobanEnv(show_border=False)
    grid, small = full.reset(seed=3)[0].splitlines(), inner.reset(seed=3)[0].splitlines()
    assert small == [row[1:-1] for row in grid[1:-1]] and len(small) == 4


def test_render_modes():
    env = SokobanEnv(render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    image = env.render()
    assert np.array_equal(obs.images[0], image)
    obs = obs.text
    assert image.dtype == np.uint8 and image.shape == (6 * 16, 6 * 16, 3)
    r, c = divmod(obs.replace("\n", "").index("P"), 6)
    assert tuple(image[r * 16 + 8, c * 16 + 8]) == (60, 90, 220)
    assert tuple(image[0, 0]) == (70, 70, 70)
    text_env = SokobanEnv(render_mode="ansi")
    assert text_env.render_mode == "ansi" and text_env.reset(seed=0)[0] == (text_env.render() or "")


@pytest.mark.parametrize(
    "config, message",
    [
        ({"dim_room": (4, 6)}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"max_solution_length": 0}, "max_solution_length"),
    ],
)
def test_bad_config_raises(config, message):
    with pytest.raises(ValueError, match=message):
        make_env("sokoban", config)


def test_check_env_with_render_modes(monkeypatch):
    monkeypatch.setitem(os.environ, "SDL_VIDEODRIVER", "dummy")
    env = gymnasium.make("roll/Sokoban-v0", dim_room=[6, 6])
    check_env(env.unwrapped)
    env = make_env("sokoban", {"dim_room": [6, 6], "num_boxes": 2, "show_border": False})
    assert isinstance(env, SokobanEnv)


def test_roll_grid_lookup_and_vocab():
    """ROLL's env_config.grid_lookup (cell code -> symbol) and grid_vocab (symbol -> legend name)."""
    from roll.envs.sokoban.env import SokobanEnv

    lookup = {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
    plain, _ = SokobanEnv().reset(seed=3)
    env = SokobanEnv(grid_lookup=lookup, grid_vocab={"W": "wall", ".": "empty"})
    obs, info = env.reset(seed=3)
    assert obs == plain.translate(str.maketrans("#_OX*PS", "W.GBCA@"))
    assert "Symbols: W wall, . empty." in info["env_instruction"]
    obs, *_ = env.step("<answer>Right</answer>")
    assert set(obs) <= set("W.GBCA@\n")
    with pytest.raises(ValueError, match="must map a code 0-6 to one character"):
        SokobanEnv(grid_lookup={7: "x"})
