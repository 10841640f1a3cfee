"""GSM8K-as-env: check_env, seeded determinism, correct / wrong / retry / invalid flows, data errors."""

import json

import pytest
from gymnasium.utils.env_checker import check_env

from roll.envs import make_env
from roll.envs.gsm8k import GSM8KEnv, load_gsm8k

ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 1,000 pins; 250 are used. How many are left?", "answer": "1000 - 250 = 750\n#### 750"},
    {"question": "Half of 5 cakes is eaten. How many cakes are eaten?", "answer": "5 / 2 = 2.5\n#### 2.5"},
]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def test_check_env_on_shipped_sample():
    check_env(make_env("gsm8k", {"split": "test"}), skip_render_check=True)


def test_same_seed_same_problem_and_index_option(data_file):
    env_a, env_b = GSM8KEnv(data_path=data_file), GSM8KEnv(data_path=data_file)
    firsts = [env_a.reset(seed=s)[0] for s in range(10)]
    assert firsts == [env_b.reset(seed=s)[0] for s in range(10)]
    assert len(set(firsts)) > 1  # different seeds reach different problems
    obs, info = env_a.reset(seed=0, options={"index": 1})
    assert obs == ROWS[1]["question"] and info["ground_truth"] == "750" and info["problem_index"] == 1


def test_correct_first_try(data_file):
    env = GSM8KEnv(data_path=data_file)
    env.reset(seed=0, options={"index": 1})
    obs, reward, terminated, truncated, info = env.step("250 are used, so <answer>750</answer>")
    assert (obs, reward, terminated, truncated) == ("Correct.", 1.0, True, False)
    assert info["success"] and info["metrics"]["attempts"] == 1.0


def test_wrong_then_retry_with_discount(data_file):
    env = GSM8KEnv(data_path=data_file, max_turns=3, retry_discount=0.5)
    env.reset(seed=0, options={"index": 2})
    obs, reward, terminated, truncated, info = env.step("<answer>3</answer>")
    assert (obs, reward, terminated, truncated) == ("Incorrect, try again. (2 attempts left)", 0.0, False, False)
    assert info["action_is_valid"] and not info["success"]
    obs, reward, terminated, _, info = env.step("<answer>5/2</answer>")  # 5/2 == 2.5
    assert (obs, reward, terminated) == ("Correct.", 0.5, True)
    assert info["metrics"] == {"num_steps": 2.0, "invalid_actions": 0.0, "attempts": 2.0, "correct": 1.0}


def test_invalid_answer_and_running_out_of_attempts(data_file):
    env = GSM8KEnv(data_path=data_file, max_turns=2, format_penalty=-0.2)
    question, _ = env.reset(seed=0, options={"index": 0})
    obs, reward, terminated, truncated, info = env.step("I think it is 7")  # no <answer> tag
    assert (obs, reward, terminated, truncated) == (question, -0.2, False, False)
    assert not info["action_is_valid"]
    obs, reward, terminated, truncated, info = env.step("<answer>8</answer>")
    # the attempt budget is part of the task: running out terminates (no bootstrapping past it)
    assert (obs, reward, terminated, truncated) == ("Incorrect, try again. (0 attempts left)", 0.0, True, False)
    assert not info["success"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("<answer>7</answer>")


def test_bad_data_and_arguments(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"question": "q", "answer": "no final"}) + "\n")
    with pytest.raises(ValueError, match=r"1 row\(s\) lack .*rows 1\)"):
        load_gsm8k(str(path))
    with pytest.raises(FileNotFoundError, match="data_path="):
        GSM8KEnv(data_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="retry_discount=0"):
        GSM8KEnv(retry_discount=0)
    with pytest.raises(ValueError, match="split='dev'"):
        GSM8KEnv(split="dev")
