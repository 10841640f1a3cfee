"""FrozenLake text env: maps, moves, rewards, slipping, solution(), check_env."""

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from roll.envs import make_env
from roll.envs.frozen_lake import FrozenLakeTextEnv

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]  # Gymnasium's classic 4x4 map


def act(env, word):
    return env.step(f"<answer>{word}</answer>")


def test_text_grid_moves_and_goal_reward():
    env = FrozenLakeTextEnv(max_steps=10)
    obs, info = env.reset(seed=0, options={"desc": MAP})
    assert obs == "P___\n_O_O\n___O\nO__G"
    assert info["metrics"]["distance_to_goal"] == 6
    obs, reward, terminated, _, info = act(env, "left")  # edge: no move, still valid
    assert (obs.splitlines()[0], reward, terminated, info["action_is_valid"]) == ("P___", 0.0, False, True)
    for word in ["Down", "Down", "Right", "Down", "Right"]:
        obs, reward, terminated, truncated, info = act(env, word)
        assert reward == 0.0 and not terminated
    obs, reward, terminated, truncated, info = act(env, "Right")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs.splitlines()[-1] == "O__*" and info["metrics"]["distance_to_goal"] == 0


def test_hole_ends_episode_without_success():
    env = FrozenLakeTextEnv()
    env.reset(options={"desc": MAP})
    act(env, "Right")
    obs, reward, terminated, _, info = act(env, "Down")
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    assert obs.splitlines()[1] == "_X_O"


def test_invalid_action_and_truncation():
    env = FrozenLakeTextEnv(max_steps=2, format_penalty=-0.3)
    obs0, _ = env.reset(options={"desc": MAP})
    obs, reward, terminated, truncated, info = act(env, "Jump")
    assert (obs, reward, terminated, truncated, info["action_is_valid"]) == (obs0, -0.3, False, False, False)
    assert act(env, "Down")[3] is True


def test_random_maps_always_have_a_path_and_solution_reaches_goal():
    for size in (3, 4, 6, 8):
        env = FrozenLakeTextEnv(size=size, p=0.7, max_steps=4 * size * size)
        for seed in range(25):
            obs, _ = env.reset(seed=seed)
            assert obs[0] == "P" and obs[-1] == "G" and len(obs.splitlines()) == size
            plan = env.solution()
            assert plan is not None and len(plan) >= 2 * (size - 1)
            for word in plan:
                _, reward, terminated, _, info = act(env, word)
            assert terminated and reward == 1.0 and info["success"]


def test_slippery_follows_gymnasium_model_and_is_seeded():
    def outcomes(seed):
        env = FrozenLakeTextEnv(is_slippery=True, max_steps=50)
        env.reset(seed=seed, options={"desc": ["SFF", "FFF", "FFG"]})
        return [act(env, "Right")[0] for _ in range(5)]

    assert outcomes(7) == outcomes(7)
    env = FrozenLakeTextEnv(is_slippery=True, max_steps=1000)
    moved = {"Right": 0, "Down": 0, "none": 0}
    for seed in range(300):  # from the start cell, "Right" slips Up (no move) / Down with 1/3 each
        env.reset(seed=seed, options={"desc": ["SFF", "FFF", "FFG"]})
        obs = act(env, "Right")[0]
        moved["Right" if obs.startswith("_P") else "Down" if obs.startswith("_") else "none"] += 1
    assert all(60 < n < 140 for n in moved.values()), moved


def test_determinism_and_variety():
    env = FrozenLakeTextEnv(size=5)
    maps = [env.reset(seed=s)[0] for s in range(8)]
    assert maps == [env.reset(seed=s)[0] for s in range(8)] and len(set(maps)) > 4


@pytest.mark.parametrize("config, message", [({"size": 1}, "size=1"), ({"p": 0.0}, "p=0.0")])
def test_bad_config(config, message):
    with pytest.raises(ValueError, match=message):
        make_env("frozen_lake", config)


def test_check_env():
    check_env(gymnasium.make("roll/FrozenLake-v0", size=4).unwrapped)
    check_env(make_env("frozen_lake", {"is_slippery": True}), skip_render_check=True)
