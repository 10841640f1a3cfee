"""A dead learning signal is counted, warned about once with its cause, and stops the run after
``zero_signal_patience`` steps in a row; groups of one that can never give a signal are refused before any
worker starts."""

from __future__ import annotations

import pytest
import torch

from roll.config.errors import ConfigError
from roll.data.batch import Batch
from roll.ppo.signal import NoLearningSignal, SignalWatch, dead_signal_cause, zero_signal_groups


def _batch(adv_per_sample, groups, scores):
    n = len(groups)
    response = torch.tensor([[0, 1, 1, 1]] * n)
    return Batch(
        {
            "advantages": torch.tensor(adv_per_sample, dtype=torch.float32)[:, None].expand(n, 3).clone(),
            "response_mask": response,
            "scores": torch.tensor(scores, dtype=torch.float32),
        },
        {"group_id": list(groups)},
    )


def test_zero_signal_groups_counts_groups_without_any_non_zero_advantage():
    batch = _batch([0.0, 0.0, 1.0, -1.0, 0.0, 0.0], [0, 0, 1, 1, 2, 2], [1, 1, 1, 0, 0, 0])
    assert zero_signal_groups(batch) == (2, 3)  # groups 0 and 2 are dead, group 1 has contrast
    batch["advantages"][:, :] = 0
    batch["advantages"][0, 0] = 0.5  # a single non-zero token on a response keeps its group alive
    assert zero_signal_groups(batch) == (2, 3)


@pytest.mark.parametrize(
    "groups, scores, cause",
    [
        ([0, 1, 2], [1, 0, 1], "one sample"),
        ([0, 0, 1, 1], [0, 0, 0, 0], "every sample scored 0"),
        ([0, 0, 1, 1], [1, 1, 0, 0], "within each group"),
    ],
)
def test_dead_signal_cause(groups, scores, cause):
    assert cause in dead_signal_cause(_batch([0.0] * len(groups), groups, scores))


def test_watch_warns_once_and_stops_after_patience(capsys):
    watch = SignalWatch(patience=3)
    dead = _batch([0.0] * 4, [0, 0, 1, 1], [0, 0, 0, 0])
    alive = _batch([1.0, -1.0, 0.0, 0.0], [0, 0, 1, 1], [1, 0, 0, 0])
    assert watch(1, dead) == {"rollout/zero_signal_groups": 2.0, "rollout/zero_signal_frac": 1.0}
    assert watch(2, dead)["rollout/zero_signal_groups"] == 2.0
    # the count of dead steps starts again; one of the two groups teaches nothing
    assert watch(3, alive) == {"rollout/zero_signal_groups": 1.0, "rollout/zero_signal_frac": 0.5}
    watch(4, dead)
    watch(5, dead)
    err = capsys.readouterr().err
    assert err.count("every advantage is zero") == 1 and "step 1" in err and "every sample scored 0" in err
    with pytest.raises(NoLearningSignal, match=r"3 steps in a row \(up to step 6\).*zero_signal_patience=3"):
        watch(6, dead)


def test_patience_zero_never_stops():
    watch = SignalWatch(patience=0)
    dead = _batch([0.0] * 2, [0, 0], [1, 1])
    for step in range(1, 20):
        watch(step, dead)


def test_launch_turns_the_stop_into_one_line_and_exit_1(capsys, monkeypatch):
    from roll.config.agentic import AgenticConfig
    from roll.launch import command as launch

    class Dead:
        def __init__(self, cfg):
            pass

        def run(self):
            raise NoLearningSignal("5 steps in a row had only zero advantages: because")

    monkeypatch.setattr(launch, "load_checked", lambda *a, **k: AgenticConfig())
    assert launch.run_pipeline(["--config-name", "sokoban_tiny"], AgenticConfig, Dead, "sokoban_tiny") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["roll: run stopped: 5 steps in a row had only zero advantages: because"]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["adv_estimator=grpo", "train_env_manager.group_size=1", "train_env_manager.env_groups=64"], "grpo compares"),
        (
            ["adv_estimator=reinforce", "train_env_manager.group_size=1", "train_env_manager.env_groups=64"],
            r"reward_normalization \(grouping state, mean group, std group\)",
        ),
        (  # ROLL's rule: a std zeroes a group of one, even the batch's
            [
                "adv_estimator=reinforce",
                "train_env_manager.group_size=1",
                "train_env_manager.env_groups=64",
                "reward_normalization.method=identity",
                "reward_normalization.norm_mean_type=batch",
                "reward_normalization.norm_std_type=batch",
            ],
            r"reward_normalization \(grouping state, mean batch, std batch\)",
        ),
    ],
)
def test_groups_of_one_are_refused_before_any_worker(overrides, match):
    from roll.config.agentic import AgenticConfig
    from roll.launch.command import load_checked

    with pytest.raises(ConfigError, match=match) as info:
        load_checked("sokoban_tiny", overrides=overrides, schema=AgenticConfig)
    assert info.value.key == "train_env_manager.group_size"


def test_groups_of_one_with_a_batch_normalization_are_allowed():
    from roll.config.agentic import AgenticConfig
    from roll.launch.command import load_checked

    load_checked(
        "sokoban_tiny",
        overrides=[
            "adv_estimator=reinforce",
            "train_env_manager.group_size=1",
            "train_env_manager.env_groups=64",
            "reward_normalization.grouping=batch",
        ],
        schema=AgenticConfig,
    )


def test_groups_of_one_with_the_batch_mean_only_are_allowed():
    """Without a std a group of one keeps s - mean_batch: a signal."""
    from roll.config.agentic import AgenticConfig
    from roll.launch.command import load_checked

    load_checked(
        "sokoban_tiny",
        overrides=[
            "adv_estimator=reinforce",
            "train_env_manager.group_size=1",
            "train_env_manager.env_groups=64",
            "reward_normalization.method=identity",
            "reward_normalization.norm_mean_type=batch",
        ],
        schema=AgenticConfig,
    )


def test_a_users_method_with_norm_types_is_a_config_error():
    from roll.config.agentic import AgenticConfig
    from roll.launch.command import load_checked

    with pytest.raises(ConfigError, match=r"^reward_normalization.norm_std_type='group': method .*formula of its own"):
        load_checked(
            "sokoban_tiny",
            overrides=[
                "reward_normalization.method='tests.extensions.user_plugins:median_norm'",
                "reward_normalization.norm_std_type=group",
            ],
            schema=AgenticConfig,
        )
