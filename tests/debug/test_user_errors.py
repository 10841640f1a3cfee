"""Errors in user code (an env's ``step``, a reward function) point at the user's own source lines.

An env's exception, in local and Ray mode alike, ends its trajectory and is recorded on it (with the ``file:line``
that raised), counted (``rollout/env_failures``, ``rollout/env_errors/<type>``) and printed once per step on one
line; ``raise_env_errors=true`` re-raises it with its traceback instead. A reward's exception propagates
unchanged, with a note naming the reward function and its ``file:line``.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from roll.agentic.scheduler import RolloutScheduler
from roll.config.agentic import AgenticConfig
from roll.config.loader import load_config
from roll.distributed.roles import InferProxy
from roll.rewards.workers import RewardWorkerPool
from roll.strategies.base import StrategyContext
from roll.strategies.registry import strategy_spec
from tests.debug import broken_user_code as user

USER_FILE = str(Path(user.__file__).resolve())
ENV_LINE, REWARD_LINE = user.raising_lines()


@pytest.fixture(autouse=True)
def registered():
    """The broken env and reward are registered for each test of this module only."""
    user.register()
    yield
    user.unregister()


def rollout_config(model_dir: str) -> AgenticConfig:
    """8 envs in 2 groups of the broken env (every other one raises), short episodes, the tiny model."""
    cfg = load_config(
        "sokoban_tiny",
        overrides=[
            f"pretrain={model_dir}",
            "sft_warmup.enabled=false",
            "val_env_manager=null",
            "rollout_batch_size=4",
            "train_env_manager.env_groups=2",
            "train_env_manager.group_size=4",
            "actor_train.training_args.per_device_train_batch_size=2",
            "actor_train.training_args.gradient_accumulation_steps=1",
            f"custom_envs.SimpleSokoban.env_type={user.ENV_TYPE}",
            "custom_envs.SimpleSokoban.max_actions_per_traj=2",
            "custom_envs.SimpleSokoban.max_tokens_per_step=4",
            "actor_infer.num_cpus_per_worker=1",
        ],
        schema=AgenticConfig,
    )
    cfg.actor_infer.model_args.model_name_or_path = model_dir  # start_workers does this in a pipeline
    return cfg


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def check_env_failures_reported(scheduler: RolloutScheduler, trajs: list, metrics: dict, printed: str) -> None:
    """Failed trajectories were dropped, counted by type, and printed on one line naming the user's line."""
    assert all(t.failure is None for t in trajs) and trajs  # isolated: the others made a batch
    assert metrics["rollout/env_failures"] == metrics["rollout/env_errors/RuntimeError"] == len(scheduler.failed) > 0
    where = f"{USER_FILE}:{ENV_LINE} in step"
    assert all(t.failure_at == where and t.failure_type == "RuntimeError" for t in scheduler.failed)
    lines = [line for line in printed.splitlines() if "deliberate bug in BrokenSokoban.step" in line]
    assert len(lines) == 1, printed  # one line per distinct failure and step
    assert f"{len(scheduler.failed)} trajectories failed: env.step: RuntimeError" in lines[0] and where in lines[0]
    assert "env tag 'SimpleSokoban', seed " in lines[0] and "turn 1" in lines[0], lines[0]


@pytest.mark.slow
def test_env_error_in_local_mode_is_isolated_and_names_user_line(tiny_model_dir, capsys):
    from roll.distributed.group import LocalWorkerGroup

    cfg = rollout_config(tiny_model_dir)
    infer = InferProxy(LocalWorkerGroup("actor_infer", cfg.actor_infer, num_threads=1), strategy_spec("hf_infer"))
    infer.initialize(StrategyContext(seed=cfg.seed))
    scheduler = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer, use_ray=False)
    trajs, metrics = scheduler.rollout(1, 4)
    check_env_failures_reported(scheduler, trajs, metrics, capsys.readouterr().out)
    cfg.train_env_manager.raise_env_errors = True  # debugging: the env's own traceback
    scheduler = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer, use_ray=False)
    with pytest.raises(RuntimeError, match="deliberate bug in BrokenSokoban.step") as info:
        scheduler.rollout(1, 4)
    text = _format(info.value)
    assert f'File "{USER_FILE}", line {ENV_LINE}, in step' in text, text


@pytest.mark.parametrize("timeout_s", [0.0, 5.0])  # called directly, or on a deadline thread
def test_reward_error_in_local_mode_points_at_user_line(timeout_s):
    pool = RewardWorkerPool(num_workers=2, use_ray=False, timeout_s=timeout_s)
    assert [r.score for r in pool.compute(["a", "b"], ["a", "c"], [user.REWARD_NAME] * 2)] == [1.0, 0.0]
    with pytest.raises(ZeroDivisionError) as info:  # the user's own exception type, unchanged
        pool.compute(["a", "boom"], ["a", "a"], [user.REWARD_NAME] * 2)
    text = _format(info.value)
    assert f'File "{USER_FILE}", line {REWARD_LINE}, in broken_reward' in text, text
    assert f"reward function {user.REWARD_NAME!r}" in text and f"raised at {USER_FILE}:{REWARD_LINE}" in text
    assert "sample 1" in text


@pytest.mark.slow
def test_reward_error_under_ray_names_function_and_line(ray_session):
    pool = RewardWorkerPool(num_workers=1, num_cpus_per_worker=0.5)
    try:
        assert pool.compute(["x"], ["x"], [user.REWARD_NAME])[0].score == 1.0  # the user's reward reached the actor
        with pytest.raises(Exception) as info:
            pool.compute(["x", "boom"], ["x", "x"], [user.REWARD_NAME] * 2)
    finally:
        pool.shutdown()
    message = str(info.value)
    assert isinstance(info.value, ZeroDivisionError)  # Ray's error is also an instance of the user's type
    assert f"reward function {user.REWARD_NAME!r}" in message, message
    assert f"{USER_FILE}:{REWARD_LINE}" in message, message


@pytest.mark.slow
def test_env_error_under_ray_is_recorded_and_counted(ray_session, tiny_model_dir, capsys):
    from roll.distributed.group import RayWorkerGroup

    cfg = rollout_config(tiny_model_dir)
    group = RayWorkerGroup("actor_infer", cfg.actor_infer, timeout_s=300)
    infer = InferProxy(group, strategy_spec("hf_infer"))
    try:
        infer.initialize(StrategyContext(seed=cfg.seed))
        scheduler = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer, use_ray=True)
        trajs, metrics = scheduler.rollout(1, 4)
    finally:
        group.shutdown()
    check_env_failures_reported(scheduler, trajs, metrics, capsys.readouterr().out)
