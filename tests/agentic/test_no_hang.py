"""Nothing a user's env or tool does can hang a rollout: calls that never return are abandoned at their deadline,
counted, their envs replaced, and the pool keeps its size, with fewer threads than hung calls, locally and under Ray.

Every test runs its rollout on a watchdog thread (:func:`bounded`), so an implementation that hangs fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from roll.agentic.env_manager import EnvManager, plan_groups
from roll.calls import CallPool, TooManyHungCalls
from roll.config.agentic import AgenticConfig, CustomEnvConfig, EnvManagerConfig
from tests.agentic.helpers import ScriptedGenerator

BOUND_S = 120.0  # far above what these rollouts take; only a hang gets near it


def bounded(fn: Callable[[], Any], seconds: float = BOUND_S) -> Any:
    """``fn()`` on a daemon thread; fails the test if it has not returned after ``seconds``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"hung: no return within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture(scope="module")
def hang_tool():
    """The never-returning tool, registered for this module's tests only (other tests list the registry)."""
    import importlib
    import sys

    from roll.envs.tool_use import tools

    module = importlib.import_module("tests.agentic.hang_tool")
    yield module
    release_hung_calls(module)
    tools.TOOLS.unregister("hang")
    sys.modules.pop("tests.agentic.hang_tool", None)


def release_hung_calls(module) -> None:
    for event in module.HANGING:
        event.set()
    module.HANGING.clear()


def test_pool_survives_more_hung_calls_than_threads():
    """2 threads, 6 calls that never return among 4 that do: every call gets an outcome, the pool keeps 2 working
    threads (a next batch runs), and an abandoned call's thread retires when the call finally returns."""
    gate = threading.Event()
    pool = CallPool(2)
    calls = [(lambda i=i: gate.wait() or i) if i % 5 < 3 else (lambda i=i: i) for i in range(10)]
    outcomes = bounded(lambda: pool.run_all(calls, timeout=0.2))
    assert [o.timed_out for o in outcomes] == [i % 5 < 3 for i in range(10)]
    assert [o.value for o in outcomes if o.ok] == [3, 4, 8, 9]
    assert pool.abandoned == pool.hung == 6
    assert pool.live_threads == 2 + 6  # 2 working, 6 stuck in abandoned calls
    assert [o.value for o in bounded(lambda: pool.run_all([lambda: "a", lambda: "b", lambda: "c"], 0.2))] == [
        "a",
        "b",
        "c",
    ]
    gate.set()  # the abandoned calls return: their threads retire, the pool is back to 2
    for _ in range(200):
        if pool.hung == 0 and pool.live_threads == 2:
            break
        threading.Event().wait(0.05)
    assert pool.hung == 0 and pool.live_threads == 2


def test_pool_stops_after_max_hung_calls():
    gate = threading.Event()
    pool = CallPool(1, max_hung=3)
    try:
        with pytest.raises(TooManyHungCalls, match="4 calls never returned"):
            bounded(lambda: pool.run_all([gate.wait] * 6, timeout=0.1))
    finally:
        gate.set()


def tool_config(env_threads: int, timeout: float) -> EnvManagerConfig:
    return EnvManagerConfig(
        tags=["Tools"], env_groups=4, group_size=2, env_threads=env_threads, env_step_timeout=timeout
    )


ENV_TYPE = "tests.agentic.hang_tool:tool_use"  # importing the module registers the tool (in Ray actors too)
CALL = '<tool_call>{"name": "hang", "arguments": {}}</tool_call>'
CUSTOM = {
    "Tools": CustomEnvConfig(
        env_type=ENV_TYPE,
        env_config={"tools": ["hang"], "max_steps": 3},
        max_actions_per_traj=2,
        max_tokens_per_step=40,
        system_prompt="You play.",
    )
}


def manager_args(manager: EnvManagerConfig, tok_dir: str) -> tuple:
    return (
        manager,
        plan_groups(manager, CUSTOM),
        tok_dir,
        AgenticConfig().actor_infer.generating_args,
        4096,
        42,
        "train",
    )


def check_rollout(result: Any, hung: int) -> None:
    timeouts = [t for t in result.trajectories if t.failure_kind == "timeout"]
    assert len(timeouts) == hung == result.envs_replaced
    for t in timeouts:
        assert t.failure_type == "Timeout" and "env_step_timeout=0.5s" in t.failure and t.failure_turn == 1
    finished = [t for t in result.trajectories if t.failure is None]
    assert len(finished) == 8 - hung and all(len(t.turns) == 2 for t in finished)  # the others played on


def test_hung_tool_local_mode(hang_tool, qwen_tokenizer_dir):
    """8 envs, 2 threads, 4 tools that never return in the first rollout (even-numbered tool instances): the
    rollout ends, the hung envs are replaced, and the next rollout (2 of the 4 fresh envs hang) ends too."""
    hang_tool._instances = iter(range(0, 10_000))  # instance 0 hangs, 1 answers, ...
    manager = EnvManager(*manager_args(tool_config(env_threads=2, timeout=0.5), qwen_tokenizer_dir))
    generator = ScriptedGenerator(manager.tokenizer, CALL)
    try:
        check_rollout(bounded(lambda: manager.rollout(1, generator)), hung=4)
        check_rollout(bounded(lambda: manager.rollout(2, generator)), hung=2)
        assert manager.pool.hung == 6
    finally:
        release_hung_calls(hang_tool)


@pytest.mark.slow
def test_hung_tool_ray_mode(ray_session, hang_tool, qwen_tokenizer_dir):
    """The same under Ray: the env manager is an actor (as the rollout scheduler makes it), its hung tool calls are
    abandoned inside the actor, and the driver's ``ray.get`` returns."""
    ray = ray_session
    cls = ray.remote(num_cpus=0.5)(EnvManager)
    manager = cls.remote(*manager_args(tool_config(env_threads=2, timeout=0.5), qwen_tokenizer_dir))
    from roll.models.loading import load_tokenizer

    generator = ScriptedGenerator(load_tokenizer(qwen_tokenizer_dir), CALL)
    for step, hung in ((1, 4), (2, 2)):
        check_rollout(ray.get(manager.rollout.remote(step, generator), timeout=BOUND_S), hung)
    ray.kill(manager)


def test_an_env_constructor_that_never_returns(qwen_tokenizer_dir):
    """The preflight builds each env under env_step_timeout (one config-error line naming the tag), and so do the
    env managers."""
    from roll.config.errors import ConfigError
    from roll.launch.preflight import check_envs
    from tests.agentic.conftest import make_cfg

    cfg = make_cfg(env_config={"hang_init": True}, env_step_timeout=0.5)
    with pytest.raises(ConfigError) as info:
        bounded(lambda: check_envs(cfg))
    assert str(info.value) == (
        "custom_envs.Flaky.env_type='flaky_test': building the env did not return within "
        "env_step_timeout=0.5s; its constructor hangs"
    )
    m = cfg.train_env_manager
    with pytest.raises(
        RuntimeError, match="env tag 'Flaky': building the env did not return within env_step_timeout=0.5s"
    ):
        bounded(
            lambda: EnvManager(
                m,
                plan_groups(m, cfg.custom_envs),
                qwen_tokenizer_dir,
                cfg.actor_infer.generating_args,
                2048,
                42,
                "train",
            )
        )


@pytest.mark.slow
def test_env_managers_without_room_on_the_cluster_fail_fast(ray_session):
    """An env manager actor that Ray cannot place (the cluster is short of CPUs) stops the run at startup with what
    it needs; before, the first rollout waited on it forever."""
    from roll.agentic.scheduler import MANAGER_CPUS, _await_started

    @ray_session.remote(num_cpus=MANAGER_CPUS)
    class Manager:
        pass

    fits = [Manager.remote() for _ in range(2)]
    bounded(lambda: _await_started(fits, "train", "EnvManager", 60.0))
    too_many = [Manager.remote() for _ in range(8)]  # 2 CPUs hold 4, two of which are taken
    message = r"of 8 train EnvManager actors did not start within 2s; each reserves 0.5 CPU"
    with pytest.raises(RuntimeError, match=message):
        bounded(lambda: _await_started(too_many, "train", "EnvManager", 2.0))
    for actor in fits + too_many:
        ray_session.kill(actor)


@pytest.mark.slow
def test_a_ray_started_by_roll_counts_the_env_managers(tmp_path, tiny_model_dir):
    """A sokoban_tiny step with 4 env managers on a Ray that roll starts: Ray is sized for the managers too, whatever
    the machine's cores (they used to be left pending, and the rollout waited forever)."""
    from roll.config.loader import load_config
    from roll.pipelines.agentic_pipeline import AgenticPipeline

    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    overrides = [
        f"pretrain={tiny_model_dir}",
        "tiny_model=null",
        f"output_dir={tmp_path}",
        f"logging_dir={tmp_path}/logs",
        "distributed=ray",
        "track_with=stdout",
        "max_steps=1",
        "save_steps=0",
        "eval_steps=0",
        "trajectory_dump_steps=0",
        "sft_warmup.enabled=false",
        "rollout_batch_size=16",
        "train_env_manager.env_groups=4",
        "train_env_manager.group_size=4",
        "train_env_manager.num_env_managers=4",
        "val_env_manager=null",
        "zero_signal_patience=0",
        "actor_infer.generating_args.max_new_tokens=4",
        "custom_envs.SimpleSokoban.max_tokens_per_step=4",
        "custom_envs.SimpleSokoban.max_actions_per_traj=2",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
    ]
    try:
        pipe = AgenticPipeline(load_config("sokoban_tiny", overrides=overrides))
        pipe.run()  # pytest-timeout bounds it
        assert ray.cluster_resources()["CPU"] >= 2 + 4 * 0.5
    finally:
        ray.shutdown()
