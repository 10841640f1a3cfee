"""ProxyEnvManager: agent runners played in groups through the gateway by the real RolloutScheduler (hf_infer,
tiny model), with crashing and hanging harnesses isolated and counted; a runner that is an external program; the
config keys (ROLL's spelling included) and their one-line errors."""

from __future__ import annotations

import json
import sys
import time

import pytest

from roll.agentic.gateway.manager import ProxyEnvManager, env_manager_class
from roll.agentic.scheduler import RolloutScheduler, rollout_metrics
from roll.config.errors import ConfigError
from roll.models.loading import load_tokenizer
from tests.agentic import proxy_runners
from tests.agentic.conftest import make_cfg

ROLL_PROXY = "roll.pipeline.agentic.env_manager.proxy_env_manager.ProxyEnvManager"


@pytest.fixture(scope="module")
def infer_group(tiny_model_dir):
    from roll.config.worker import WorkerConfig
    from roll.distributed.group import LocalWorkerGroup
    from roll.distributed.roles import InferProxy
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import strategy_spec

    worker = WorkerConfig()
    worker.model_args.model_name_or_path = tiny_model_dir
    worker.strategy_args.strategy_name = "hf_infer"
    infer = InferProxy(LocalWorkerGroup("actor_infer", worker, num_threads=1), strategy_spec("hf_infer"))
    infer.initialize(StrategyContext(seed=0))
    return infer


def _agent_cfg(runner: str = "tests.agentic.proxy_runners.harness", timeout: float = 20.0, **kwargs):
    cfg = make_cfg(group_size=4, env_groups=4, batch=16, max_tokens=8, max_refill_rounds=0)
    env = cfg.custom_envs["Flaky"]
    env.env_manager_cls, env.agent_runner_cls, env.agent_runner_kwargs = ROLL_PROXY, runner, dict(kwargs)
    env.agent_timeout = timeout
    return cfg


@pytest.mark.slow
def test_runners_play_in_groups_and_failures_are_counted(infer_group, tiny_model_dir):
    proxy_runners.LATE.clear()
    cfg = _agent_cfg(timeout=8.0, crash=[[0, 1]], hang=[[2, 3]])
    cfg.check_pipeline()
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    assert isinstance(sched.managers[0], ProxyEnvManager)
    batch, metrics = sched.rollout(1, 16)
    failed = {(t.group_id, t.env_id): t for t in sched.failed}
    assert set(failed) == {(0, 1), (2, 3)}
    assert failed[(0, 1)].failure_kind == "error" and "harness crashed" in failed[(0, 1)].failure
    assert failed[(2, 3)].failure_kind == "timeout"
    assert metrics["rollout/env_failures"] == 1 and metrics["rollout/env_timeouts"] == 1
    assert len(batch) == 14 == sched.batch_multiple * 14  # groups 0 and 2 keep 3 members each
    for t in batch:
        assert len(t.turns) == 2 and t.failure is None
        assert t.score == float(t.seed % 2) and t.turns[-1].reward == t.score  # the runner's reward, last turn
        assert t.env_metrics["calls"] == 2 and t.env_metrics["template_breaks"] == 0
    seeds = {}
    for t in batch:
        seeds.setdefault(t.group_id, set()).add(t.seed)
    assert all(len(s) == 1 for s in seeds.values()) and len({next(iter(s)) for s in seeds.values()}) == 4
    deadline = time.monotonic() + 60
    while not proxy_runners.LATE and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proxy_runners.LATE == ["401"]  # the hung harness woke up to a closed session


def _fresh_infer(model_dir: str):
    """An hf_infer role of its own (no turn cache carried over from an earlier rollout), sampling from seed 0."""
    from roll.config.worker import WorkerConfig
    from roll.distributed.group import LocalWorkerGroup
    from roll.distributed.roles import InferProxy
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import strategy_spec

    worker = WorkerConfig()
    worker.model_args.model_name_or_path = model_dir
    worker.strategy_args.strategy_name = "hf_infer"
    infer = InferProxy(LocalWorkerGroup("actor_infer", worker, num_threads=1), strategy_spec("hf_infer"))
    infer.initialize(StrategyContext(seed=0))
    return infer


def _tokens(model_dir: str, wait_s: float) -> list[list[int]]:
    """Every turn's prompt and reply ids of one rollout of 16 jittery harnesses (temperature 1: sampled)."""
    cfg = _agent_cfg(runner="tests.agentic.proxy_runners.jittery")
    cfg.train_env_manager.gateway_wait_s = wait_s
    cfg.check_pipeline()
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", model_dir, _fresh_infer(model_dir), use_ray=False)
    batch, metrics = sched.rollout(1, 16)
    assert len(batch) == 16 and metrics["rollout/env_failures"] == 0
    return [turn.prompt_ids + turn.response_ids for t in batch for turn in t.turns]


def test_same_seed_same_rollout_whatever_the_harness_timing(tiny_model_dir):
    """Harnesses that pause at random between calls still give the same batches, so the same sampled tokens, from
    run to run (the gateway waits for every open episode's call: lock-step); without the wait they do not."""
    first, second = _tokens(tiny_model_dir, 5.0), _tokens(tiny_model_dir, 5.0)
    assert first == second
    assert _tokens(tiny_model_dir, 0.0) != first  # the control: batches as requests happen to come, other draws


@pytest.mark.parametrize("runner", ["always_raises", "always_hangs"])
def test_a_failure_on_every_episode_stops_with_the_fix_that_fits(runner, infer_group, tiny_model_dir):
    """Every episode fails the same way: one line naming what failed (the harness's exception and line, or
    agent_timeout, never env_step_timeout) and the fix, no refills advised (they would fail alike); the tracebacks
    ride along for the error log."""
    from roll.agentic.failures import RolloutFailed

    cfg = _agent_cfg(runner=f"tests.agentic.proxy_runners.{runner}", timeout=2.0)
    cfg.train_env_manager.env_groups, cfg.rollout_batch_size, cfg.train_env_manager.max_refill_rounds = 2, 8, 1
    cfg.check_pipeline()
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    with pytest.raises(RolloutFailed) as info:
        sched.rollout(1, 8)
    message = str(info.value)
    assert "\n" not in message and "max_refill_rounds" not in message and "env_step_timeout" not in message
    if runner == "always_raises":
        assert "16 of 16 trajectories failed (16 raised" in message  # the refill round failed alike
        assert "no tool named 'search'" in message and "proxy_runners.py:" in message
        assert "fix the harness: the same failure ended every failed episode" in message
        assert 'in always_raises\n    raise RuntimeError(f"no tool named' in info.value.details  # the traceback
    else:
        assert "timed out after agent_timeout=2s (custom_envs.Flaky)" in message
        assert "raise agent_timeout (agent_timeout=2s (custom_envs.Flaky)) if the harness is only slow" in message


def test_runner_names_and_arguments_are_checked_before_any_worker():
    """A runner that does not import, or keyword arguments it does not take: one config error naming the key once,
    and where modules are imported from."""
    from roll.launch.preflight import check_agents

    cfg = _agent_cfg(runner="my_agents.guess.play")
    with pytest.raises(ConfigError) as info:
        check_agents(cfg)
    text = str(info.value)
    assert text.startswith("custom_envs.Flaky.agent_runner_cls='my_agents.guess.play': cannot import 'play' from")
    assert text.count("agent_runner_cls") == 1 and "launch directory" in text and "PYTHONPATH" in text
    cfg = _agent_cfg(turnz=3)
    with pytest.raises(ConfigError) as info:
        check_agents(cfg)
    assert str(info.value).startswith("custom_envs.Flaky.agent_runner_kwargs={'turnz': 3}: ")
    assert "it takes turns, crash, hang" in str(info.value)


@pytest.mark.parametrize("catch", [False, True])
def test_the_turn_limit_is_the_gateways_and_ends_episodes_as_truncated(catch, infer_group, tiny_model_dir):
    """A harness that ignores task.max_turns is refused the call past it; whether it raises on that answer or stops,
    the episode is not a failure: it has max_actions_per_traj turns, counts as cut by the turn limit, and keeps the
    rewards it posted."""
    cfg = _agent_cfg(runner="tests.agentic.proxy_runners.greedy", catch=catch)
    cfg.train_env_manager.env_groups, cfg.rollout_batch_size = 2, 8
    cfg.check_pipeline()
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    batch, metrics = sched.rollout(1, 8)
    assert len(batch) == 8 and metrics["rollout/env_failures"] == 0
    metrics = rollout_metrics(batch)
    assert metrics["rollout/mean_actions"] == 3 == cfg.custom_envs["Flaky"].max_actions_per_traj
    assert metrics["env/Flaky/turns"] == 3 and metrics["env/Flaky/turn_limit_reached"] == 1.0
    assert all(not t.terminated and [turn.reward for turn in t.turns] == [0.25] * 3 for t in batch)


def test_a_harness_error_is_reported_with_its_whole_cause_chain(infer_group, tiny_model_dir, tmp_path):
    """A framework's error wrapping the API's (its message on a second line): the failure line has both, the cause's
    text (the refused tool_choice) and the harness's line; the dump has the traceback of both."""
    from roll.tracking.dumps import TrajectoryDumps

    cfg = _agent_cfg(runner="tests.agentic.proxy_runners.wrapped_error")
    cfg.train_env_manager.env_groups, cfg.rollout_batch_size, cfg.train_env_manager.max_refill_rounds = 2, 8, 0
    cfg.check_pipeline()
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    with pytest.raises(RuntimeError):
        sched.rollout(1, 8)
    failure = sched.failed[0].failure
    assert failure.startswith("agent.run: RuntimeError: Error while generating output: Error code: 400 - ")
    assert "tool_choice='required' is not supported by roll's gateway" in failure
    assert " <- BadRequestError (at " in failure and "proxy_runners.py:" in failure and "\n" not in failure
    dumps = TrajectoryDumps(tmp_path, 1, 0, load_tokenizer(tiny_model_dir), "agentic")
    record = json.loads(dumps.agentic("train", 1, [], failed=sched.failed).read_text().splitlines()[0])
    assert record["failure"] == failure and record["error"]["type"] == "RuntimeError"
    assert "The above exception was the direct cause" in record["error"]["traceback"]


def test_an_external_program_is_a_runner(infer_group, tiny_model_dir):
    harness = str(__import__("pathlib").Path(__file__).with_name("gateway_harness.py"))
    cfg = _agent_cfg(runner="roll.agentic.gateway.runners.CommandRunner", command=[sys.executable, harness])
    cfg.train_env_manager.env_groups, cfg.rollout_batch_size = 1, 4
    cfg.check_pipeline()
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    batch, _ = sched.rollout(1, 4)
    assert len(batch) == 4
    for t in batch:  # the program printed (tool calls made) + 0.5; the tiny model makes none
        assert len(t.turns) == 2 and t.score == 0.5


def test_config_keys_and_their_errors():
    from roll.config.roll_compat import translate
    from roll.launch.preflight import check_agents

    tree = {
        "custom_envs": {
            "A": {"env_manager_cls": ROLL_PROXY, "agent_runner_cls": "m.f"},
            "B": {
                "agent_runner_cls": None,
                "env_manager_cls": "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager",
            },
        }
    }
    assert translate(tree) == ["custom_envs.B.env_manager_cls"]
    assert tree["custom_envs"] == {"A": {"env_manager_cls": ROLL_PROXY, "agent_runner_cls": "m.f"}, "B": {}}
    cfg = _agent_cfg()
    assert env_manager_class(cfg.train_env_manager, cfg.custom_envs) is ProxyEnvManager
    cfg.custom_envs["Flaky"].agent_runner_cls = None
    with pytest.raises(ConfigError, match="custom_envs.Flaky.agent_runner_cls"):
        cfg.check_pipeline()
    cfg = make_cfg()
    cfg.custom_envs["Flaky"].agent_runner_cls = "tests.agentic.proxy_runners.harness"
    with pytest.raises(ConfigError, match="set env_manager_cls: proxy"):
        cfg.check_pipeline()
    cfg.custom_envs["Flaky"].env_manager_cls = "my.OwnManager"
    with pytest.raises(ConfigError, match="custom_envs.Flaky.env_manager_cls"):
        cfg.check_pipeline()
    cfg = _agent_cfg(runner="tests.agentic.proxy_runners.no_such_runner")
    with pytest.raises(ConfigError, match="cannot import 'no_such_runner'"):
        check_agents(cfg)
    cfg = _agent_cfg()
    cfg.custom_envs["Flaky"].tool_parser = "mistral"
    with pytest.raises(ConfigError, match="valid names: .*hermes"):
        check_agents(cfg)
    for key, value in [("agent_runner_kwargs", {"turns": 2}), ("agent_timeout", 30.0), ("tool_parser", "qwen3")]:
        cfg = make_cfg()  # a tag of roll's env manager: the gateway's keys are errors, not silently ignored
        setattr(cfg.custom_envs["Flaky"], key, value)
        with pytest.raises(ConfigError, match=rf"custom_envs.Flaky.{key}=.*read only for tags played by an agent"):
            cfg.check_pipeline()
    cfg = make_cfg()
    cfg.train_env_manager.gateway_wait_s = 1.0
    with pytest.raises(ConfigError, match="train_env_manager.gateway_wait_s=1.0: is read only by managers of agent"):
        cfg.check_pipeline()


def test_env_runner_plays_a_roll_env_with_the_native_prompts(infer_group, tiny_model_dir):
    """ROLL's GEMRunner maps to EnvRunner: the tag's env through the API, first prompts as roll's env manager's."""
    from roll.agentic.env_manager import EnvManager, plan_groups
    from roll.agentic.gateway.runners import EnvRunner
    from roll.config.roll_compat import translate

    tree = {
        "custom_envs": {
            "A": {
                "env_manager_cls": ROLL_PROXY,
                "agent_runner_cls": "roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner",
            }
        }
    }
    translate(tree)
    runner = tree["custom_envs"]["A"]["agent_runner_cls"]
    assert runner == "roll.agentic.gateway.runners.EnvRunner"
    cfg = _agent_cfg(runner=runner)
    cfg.custom_envs["Flaky"].env_config = {"max_steps": 2}
    cfg.train_env_manager.env_groups, cfg.rollout_batch_size = 2, 8
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    assert isinstance(sched.managers[0].runners["Flaky"], EnvRunner)
    batch, metrics = sched.rollout(1, 8)
    m = cfg.train_env_manager
    native = EnvManager(
        m,
        plan_groups(m, cfg.custom_envs),
        tiny_model_dir,
        cfg.actor_infer.generating_args,
        cfg.sequence_length,
        cfg.seed,
        "train",
    )
    rounds = native.rollout(1000, sched.generator)  # seeds of the scheduler's first round of step 1
    first = {t.seed: t.turns[0].prompt_ids for t in rounds.trajectories}
    assert len(batch) == 8 and metrics["rollout/env_failures"] == 0
    for t in batch:
        assert t.turns[0].prompt_ids == first[t.seed]  # same messages, same template, same ids
        assert t.turns[0].observation.endswith(f"pos {t.seed % 1000}") and len(t.turns) == 2  # the user message
        assert all(turn.reward in (-0.1, 1.0) for turn in t.turns)  # the env's rewards, posted per turn
