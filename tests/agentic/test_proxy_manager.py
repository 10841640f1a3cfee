"""ProxyEnvManager: agent runners played in groups through the gateway by the real RolloutScheduler (hf_infer,
tiny model), with crashing and hanging harnesses isolated and counted; a runner that is an external program; the
config keys (ROLL's spelling included) and their one-line errors."""

from __future__ import annotations

import sys
import time

import pytest

from roll.agentic.gateway.manager import ProxyEnvManager, env_manager_class
from roll.agentic.scheduler import RolloutScheduler
from roll.config.errors import ConfigError
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
