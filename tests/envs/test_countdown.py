"""Countdown: safe expression checking, number usage, rewards, retries, generation."""

from fractions import Fraction

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from roll.envs import make_env
from roll.envs.countdown import CountdownEnv, evaluate, leaves, parse_expression

TASK = {"numbers": [3, 7, 25, 50], "target": 71}


def answer(env, text):
    return env.step(f"<answer>{text}</answer>")


@pytest.mark.parametrize(
    "text, value",
    [("50 + 25 - 7 + 3", 71), ("(3 + 7) * 5", 50), ("7 / 2", Fraction(7, 2)), (" 3*(7-25) ", -54), ("50 = 50", 50)],
)
def test_parse_and_evaluate(text, value):
    assert evaluate(parse_expression(text)) == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo hi')",
        "2 ** 10",
        "-3 + 5",
        "3.5 + 1",
        "abs(3)",
        "x + 1",
        "3 // 2",
        "True + 1",
        "",
        "(" * 300 + "1" + ")" * 300,
        "1 + ",
        "[1, 2]",
        "3 % 2",
    ],
)
def test_rejected_expressions(text):
    assert parse_expression(text) is None


def test_leaves_in_order():
    assert leaves(parse_expression("(50 - 3) * 7 + 3")) == [50, 3, 7, 3]


def test_correct_answer_rewards_one():
    env = CountdownEnv()
    obs, info = env.reset(options=TASK)
    assert obs == "Numbers: 3 7 25 50\nTarget: 71" and "at most once" in info["env_instruction"]
    obs, reward, terminated, truncated, info = answer(env, "50 + 25 - 7 + 3")
    assert (reward, terminated, truncated, info["success"], info["value"]) == (1.0, True, False, True, "71")
    assert info["parsed_action"] == "50 + 25 - 7 + 3"


@pytest.mark.parametrize(
    "text, feedback",
    [
        ("50 + 25", "50 + 25 = 75, not 71"),
        ("50 + 25 - 3 - 3 + 2", "uses [2, 3], which are not available"),
        ("25 / (7 - 7)", "uses [7]"),
        ("3 / (50 - 50)", "uses [50]"),
        ("71", "uses [71]"),
    ],
)
def test_wrong_answers_reward_zero_and_single_turn_ends(text, feedback):
    env = CountdownEnv()
    env.reset(options=TASK)
    obs, reward, terminated, truncated, info = answer(env, text)
    assert (reward, terminated, truncated, info["action_is_valid"], info["success"]) == (0.0, True, False, True, False)
    assert feedback in obs and obs.endswith("Numbers: 3 7 25 50\nTarget: 71")


def test_division_by_zero_is_a_wrong_answer():
    env = CountdownEnv()
    env.reset(options={"numbers": [3, 3, 5, 2], "target": 4})
    obs, reward, _, _, info = answer(env, "5 / (3 - 3)")
    assert reward == 0.0 and info["value"] is None and "divides by zero" in obs


def test_unparseable_answer_gets_format_penalty():
    env = CountdownEnv(format_penalty=-0.5, max_steps=3)
    obs0, _ = env.reset(options=TASK)
    for text in ["<answer>import os</answer>", "50 + 21", "<answer>2 ** 6</answer>"]:
        obs, reward, terminated, truncated, info = env.step(text)
        assert (obs, reward, info["action_is_valid"]) == (obs0, -0.5, False)
    assert terminated and not truncated and info["metrics"]["invalid_actions"] == 3


def test_retries_with_feedback_then_success():
    env = CountdownEnv(max_steps=3)
    env.reset(options=TASK)
    obs, reward, terminated, truncated, _ = answer(env, "50 + 25")
    assert obs.startswith("Wrong: 50 + 25 = 75, not 71. Try again.\n") and not (terminated or truncated)
    _, reward, terminated, _, info = answer(env, "(50 + 25) - 7 + 3")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_use_all_numbers():
    env = CountdownEnv(use_all_numbers=True, max_steps=2)
    env.reset(options={"numbers": [2, 3, 4], "target": 5})
    assert answer(env, "2 + 3")[1] == 0.0
    assert answer(env, "2 * 4 - 3")[1] == 1.0


def test_generated_tasks_are_solvable_and_deterministic():
    for config in (
        {},
        {"num_numbers": 3, "max_number": 20, "max_target": 100},
        {"num_numbers": 6, "use_all_numbers": True},
    ):
        env = make_env("countdown", config)
        tasks = []
        for seed in range(40):
            obs, _ = env.reset(seed=seed)
            tasks.append(obs)
            (solution,) = env.solution()
            assert 1 <= env.target <= env.max_target and len(env.numbers) == env.num_numbers
            _, reward, terminated, _, _ = answer(env, solution)
            assert reward == 1.0 and terminated, (obs, solution)
        assert tasks == [env.reset(seed=s)[0] for s in range(40)] and len(set(tasks)) > 30


@pytest.mark.parametrize(
    "config, message",
    [({"num_numbers": 1}, "num_numbers=1"), ({"min_number": 0}, "min_number=0"), ({"max_target": 0}, "max_target=0")],
)
def test_bad_config(config, message):
    with pytest.raises(ValueError, match=message):
        make_env("countdown", config)


def test_check_env():
    check_env(gymnasium.make("roll/Countdown-v0").unwrapped)
    check_env(make_env("countdown", {"max_steps": 3}), skip_render_check=True)
