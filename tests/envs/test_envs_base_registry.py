"""TextEnv contract (format penalty, truncation, info keys) and the env registry."""

import gymnasium
import pytest

from roll.envs import TextEnv, Transition, get_env_class, list_envs, make_env, register_env
from roll.envs.registry import accepted_kwargs, gym_id


class CounterEnv(TextEnv):
    """Count up to ``goal`` with the action "Inc"; "Dec" goes down. Reward 1 on reaching the goal."""

    valid_actions = ("Inc", "Dec")

    def __init__(self, goal: int = 2, max_steps: int = 4, **kwargs):
        super().__init__(max_steps=max_steps, **kwargs)
        self.goal = goal
        self.value = 0

    def instruction(self) -> str:
        return f"Reach {self.goal}."

    def _reset(self, rng, options):
        self.value = int(options.get("start", rng.integers(0, 1)))
        return self._observation()

    def _apply(self, action):
        self.value += 1 if action == "Inc" else -1
        done = self.value == self.goal
        return Transition(self._observation(), 1.0 if done else 0.0, done, success=done, info={"value": self.value})

    def _observation(self):
        return f"value={self.value}"

    def _metrics(self):
        return {"value": self.value}


register_env("test_counter", CounterEnv)


def test_valid_steps_reach_goal():
    env = make_env("test_counter", {"goal": 2})
    obs, info = env.reset(seed=0)
    assert obs == "value=0" and info["env_instruction"] == "Reach 2." and info["message_role"] == "user"
    obs, reward, terminated, truncated, info = env.step("<answer>inc</answer>")
    assert (obs, reward, terminated, truncated) == ("value=1", 0.0, False, False)
    assert info["action_is_valid"] and info["parsed_action"] == "inc" and info["value"] == 1
    obs, reward, terminated, truncated, info = env.step("<answer>INC</answer>")
    assert (obs, reward, terminated, truncated, info["success"]) == ("value=2", 1.0, True, False, True)
    assert info["metrics"] == {"num_steps": 2.0, "invalid_actions": 0.0, "value": 2.0}
    with pytest.raises(RuntimeError, match="reset"):
        env.step("<answer>Inc</answer>")


def test_invalid_actions_cost_format_penalty_and_truncate():
    env = make_env("test_counter", {"goal": 5, "max_steps": 3, "format_penalty": -0.5})
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("Inc")  # no answer tags
    assert (obs, reward, terminated, truncated) == ("value=0", -0.5, False, False)
    assert info["action_is_valid"] is False and info["parsed_action"] is None
    obs, reward, _, _, info = env.step("<answer>Jump</answer>")  # parsed but not an action
    assert (obs, reward, info["parsed_action"], info["action_is_valid"]) == ("value=0", -0.5, "Jump", False)
    obs, reward, terminated, truncated, info = env.step("<answer>Inc</answer>")
    assert (obs, reward, terminated, truncated, info["success"]) == ("value=1", 0.0, False, True, False)
    assert info["metrics"]["invalid_actions"] == 2.0 and info["metrics"]["num_steps"] == 3.0


def test_think_answer_format_and_options():
    env = make_env("test_counter", {"action_format": "think_answer"})
    obs, _ = env.reset(seed=1, options={"start": 1})
    assert obs == "value=1"
    assert env.step("<answer>Inc</answer>")[4]["action_is_valid"] is False
    assert env.step("<think>one more</think><answer>Inc</answer>")[2] is True


def test_solution_is_optional():
    env = make_env("test_counter")
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="CounterEnv has no solver"):
        env.solution()


def test_registry_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"unknown env 'nope'; valid names: \[.*'test_counter'.*register_env\('nope'"):
        make_env("nope")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['gaol'\].*'goal'.*'format_penalty'"):
        make_env("test_counter", {"gaol": 3})
    with pytest.raises(ValueError, match="already registered"):
        register_env("test_counter", CounterEnv)
    with pytest.raises(TypeError, match="TextEnv subclass"):
        register_env("test_not_env", dict)
    assert "test_not_env" not in list_envs() and gym_id("test_not_env") not in gymnasium.registry
    with pytest.raises(ValueError, match="lowercase identifier"):
        register_env("Bad-Name", CounterEnv)
    with pytest.raises(ValueError, match="max_steps=0"):
        make_env("test_counter", {"max_steps": 0})
    with pytest.raises(ValueError, match="render_mode='human'"):
        make_env("test_counter", {"render_mode": "human"})


def test_registry_lookup_and_gymnasium():
    assert "test_counter" in list_envs() and get_env_class("test_counter") is CounterEnv
    assert gym_id("frozen_lake") == "roll/FrozenLake-v0"
    assert accepted_kwargs(CounterEnv) == ["goal", "max_steps", "format_penalty", "action_format", "render_mode"]
    env = gymnasium.make("roll/TestCounter-v0", goal=1)
    env.reset(seed=3)
    assert env.step("<answer>Inc</answer>")[2] is True


def test_check_env_passes():
    from gymnasium.utils.env_checker import check_env

    check_env(gymnasium.make("roll/TestCounter-v0").unwrapped, skip_render_check=True)
