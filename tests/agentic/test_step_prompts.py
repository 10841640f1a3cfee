"""ROLL's step prompts (``turn_prompt: fresh``, its StepEnvManager): every turn is a new conversation whose one
template holds ROLL's placeholders with ROLL's meaning, every later turn starts a sample, the engine is given
exactly that prompt, and ``trajectory_mode: step`` trains one sample per turn on it."""

from __future__ import annotations

import re

import pytest

from roll.agentic.env_manager import EnvManager, plan_groups
from roll.data.layout import sample_layouts, trajectories_to_batch
from tests.agentic.conftest import make_cfg
from tests.agentic.helpers import ScriptedGenerator

TEMPLATE = (
    "I: {env_instruction} | done {step_count} | last {history_length}: [{history}] | "
    "now {current_step}: {current_observation} | max {max_response_length}"
)


class RecordingGenerator(ScriptedGenerator):
    """The scripted generator, keeping every prompt it was given."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.prompts: list[list[int]] = []

    def generate(self, prompts, args, max_new_tokens=None):
        self.prompts += [list(p) for p in prompts]
        return super().generate(prompts, args, max_new_tokens)


def test_every_turn_is_a_fresh_prompt_with_rolls_placeholders(qwen_tokenizer_dir):
    cfg = make_cfg(group_size=2, env_groups=1, max_actions=3, batch=2)
    spec = cfg.custom_envs["Flaky"]
    spec.turn_prompt, spec.trajectory_mode, spec.history_length = "fresh", "step", 2
    spec.first_turn_template = spec.turn_template = TEMPLATE
    manager = cfg.train_env_manager
    env_manager = EnvManager(
        manager,
        plan_groups(manager, cfg.custom_envs),
        qwen_tokenizer_dir,
        cfg.actor_infer.generating_args,
        cfg.sequence_length,
        cfg.seed,
        "train",
    )
    gen = RecordingGenerator(env_manager.tokenizer)
    trajs = env_manager.rollout(1, gen).trajectories
    fmt = env_manager.formatters["Flaky"]
    for traj in trajs:
        p = int(traj.turns[0].observation.split()[1])  # FlakyEnv starts at "pos {seed % 1000}", +1 per action
        expected = [  # history_length 2 (ROLL's meaning): the last completed turn only
            f"I: Answer go. | done 0 | last 0: [] | now 1: pos {p} | max 8",
            f"I: Answer go. | done 1 | last 1: [(step: 1, observation: pos {p}, action: go, reward: 1.0)] | "
            f"now 2: pos {p + 1} | max 8",
            f"I: Answer go. | done 2 | last 1: [(step: 2, observation: pos {p + 1}, action: go, reward: 1.0)] | "
            f"now 3: pos {p + 2} | max 8",
        ]
        assert [m["content"] for m in traj.messages if m["role"] == "user"] == expected
        assert [t.prompt_ids for t in traj.turns] == [fmt.first_prompt(text) for text in expected]
        assert [t.starts_sample for t in traj.turns] == [False, True, True] and traj.template_breaks == 2
        assert traj.token_ids() == traj.turns[-1].prompt_ids + traj.turns[-1].response_ids
        # each sample is exactly a prompt the engine was given, then the reply
        for layout, turn in zip(sample_layouts(traj, "step"), traj.turns):
            assert layout.ids == turn.prompt_ids + turn.response_ids and turn.prompt_ids in gen.prompts
        assert [s.ids for s in sample_layouts(traj, "traj")] == [s.ids for s in sample_layouts(traj, "step")]
    assert len(trajectories_to_batch(trajs, 0, {"Flaky": "step"})) == 6


@pytest.mark.parametrize(
    "override, expected",
    [
        ("custom_envs.SimpleSokoban.trajectory_mode=turn", "trajectory_mode='turn': must be one of traj, step"),
        ("custom_envs.SimpleSokoban.turn_prompt=new", "turn_prompt='new': must be one of append, fresh"),
        ("custom_envs.SimpleSokoban.history_length=0", "history_length=0: must be >= 1"),
    ],
)
def test_step_keys_are_checked_before_any_worker(override, expected):
    from roll.config.agentic import AgenticConfig
    from roll.config.errors import ConfigError
    from roll.config.loader import load_config

    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config("sokoban_tiny", overrides=[override], schema=AgenticConfig)


def test_overflow_restart_continues_the_episode_in_a_new_sample(qwen_tokenizer_dir):
    """``overflow: restart``: where the token history would exceed sequence_length the episode goes on in a new
    conversation (the first-turn template, with the history summary) instead of ending; every sample fits."""
    cfg = make_cfg(
        group_size=2, env_groups=1, max_actions=12, sequence_length=120, env_config={"max_steps": 12}, batch=2
    )
    spec = cfg.custom_envs["Flaky"]
    spec.overflow, spec.history_length = "restart", 2
    spec.first_turn_template = "{instruction} [{history}] {observation}"
    manager = cfg.train_env_manager
    env_manager = EnvManager(
        manager,
        plan_groups(manager, cfg.custom_envs),
        qwen_tokenizer_dir,
        cfg.actor_infer.generating_args,
        cfg.sequence_length,
        cfg.seed,
        "train",
    )
    trajs = env_manager.rollout(1, ScriptedGenerator(env_manager.tokenizer)).trajectories
    fmt = env_manager.formatters["Flaky"]
    for traj in trajs:
        assert len(traj.turns) == 12 and not traj.truncated_by_length  # truncate would have ended it (see below)
        assert traj.template_breaks >= 1
        samples = sample_layouts(traj, "traj")
        assert len(samples) == traj.template_breaks + 1 and all(len(s.ids) <= 120 for s in samples)
        for k, turn in enumerate(traj.turns):
            if turn.starts_sample:
                p = int(turn.observation.split()[1])
                summary = f"(step: {k}, observation: pos {p - 1}, action: go, reward: 1.0)"
                assert turn.prompt_ids == fmt.first_prompt(f"Answer go. [{summary}] pos {p}")
    spec.overflow = "truncate"
    truncated = env_manager.rollout(1, ScriptedGenerator(env_manager.tokenizer)).trajectories
    assert all(t.truncated_by_length and len(t.turns) < 12 for t in truncated)
