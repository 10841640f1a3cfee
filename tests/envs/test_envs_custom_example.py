"""The docs' custom-env example: register, build from a config, play an episode, check_env."""

from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from roll.envs import list_envs, make_env

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch):
    """``examples`` is imported from the repository root, as a user's script would."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))


def test_guess_number_example_registers_and_plays():
    env = make_env("examples.custom_env.guess_number:guess_number", {"max_number": 16})
    assert "guess_number" in list_envs()
    obs, info = env.reset(seed=0, options={"secret": 11})
    assert obs == "Guess a number from 1 to 16." and info["env_instruction"].startswith("Guess the hidden")
    # binary search: 8 (low), 12 (high), 10 (low), 11
    expected = [
        ("8 is too low", 0.0, False),
        ("12 is too high", 0.0, False),
        ("10 is too low", 0.0, False),
        ("11 is correct!", 1.0, True),
    ]
    for guess, (text, reward, terminated) in zip([8, 12, 10, 11], expected):
        obs, r, term, trunc, info = env.step(f"I guess <answer>{guess}</answer>")
        assert obs.startswith(text) and (r, term, trunc) == (reward, terminated, False)
    assert info["success"] and info["metrics"]["distance"] == 0


def test_guess_number_invalid_and_truncation():
    env = make_env(
        "examples.custom_env.guess_number:guess_number", {"max_number": 16, "max_steps": 2, "format_penalty": -0.2}
    )
    env.reset(seed=1, options={"secret": 3})
    assert env.step("<answer>seventeen</answer>")[1] == -0.2
    _, reward, terminated, truncated, info = env.step("<answer>17</answer>")  # out of range: invalid
    assert (reward, terminated, truncated, info["metrics"]["invalid_actions"]) == (-0.2, False, True, 2)


def test_guess_number_is_a_gymnasium_env():
    import examples.custom_env.guess_number  # noqa: F401  (registered above or here)

    check_env(gymnasium.make("roll/GuessNumber-v0", max_number=16).unwrapped)
