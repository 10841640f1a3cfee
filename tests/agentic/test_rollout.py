"""RolloutScheduler over a real hf_infer worker (tiny model): dynamic batching across env managers, failure
accounting and the smaller-batch rule, timing metrics; plus the group-filtering and batching helpers."""

from __future__ import annotations

import threading

import pytest

from roll.agentic.scheduler import RolloutScheduler, fit_batch, keep_groups, rollout_metrics
from roll.data.layout import trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn
from roll.rollout.batcher import DynamicBatcher
from roll.rollout.client import RoleBackend
from roll.strategies.base import GenerationOutput, StrategyContext
from tests.agentic.conftest import make_cfg
from tests.agentic.helpers import FlakyEnv


def _traj(group: int, k: int, failed: bool = False) -> Trajectory:
    t = Trajectory(f"t{group}-{k}", env_id=k, group_id=group, tag="x", seed=group)
    t.failure = "boom" if failed else None
    return t


def test_keep_groups_and_fit_batch_by_hand():
    trajs = (
        [_traj(0, k) for k in range(4)]
        + [_traj(1, k, failed=k == 0) for k in range(4)]
        + [_traj(2, k, failed=k > 0) for k in range(4)]
        + [_traj(3, k) for k in range(4)]
    )
    usable = keep_groups(trajs, min_group=2)
    assert [(t.group_id, t.env_id) for t in usable] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 1),
        (1, 2),
        (1, 3),
        (3, 0),
        (3, 1),
        (3, 2),
        (3, 3),
    ]
    # 11 usable, multiple 4 -> 8: group 0 whole, group 1 cut to 2 so group 3 can give 2 (no group below 2)
    picked = fit_batch(usable, 16, 4, 2)
    assert [(t.group_id, t.env_id) for t in picked] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (3, 0), (3, 1)]
    assert fit_batch(usable, 16, 1, 2) == usable
    assert len(fit_batch(usable, 4, 1, 2)) == 4
    assert fit_batch(usable[:1], 16, 1, 2) == []


class _CountingInner:
    def __init__(self):
        self.calls: list[int] = []

    def generate(self, prompts, args, max_new_tokens=None):
        self.calls.append(len(prompts))
        return [GenerationOutput([p[0]]) for p in prompts]

    def leave(self):
        pass


def test_env_metrics_reach_the_metrics_per_tag():
    trajs = [
        Trajectory(f"t{i}", env_id=i, group_id=0, tag=tag, seed=0, env_metrics=m)
        for i, (tag, m) in enumerate(
            [
                ("Tools", {"tool_calls": 2.0, "tool_errors": 1.0}),
                ("Tools", {"tool_calls": 3.0}),
                ("Sokoban", {"boxes_on_target": 1.0, "note": "text is skipped"}),
            ]
        )
    ]
    metrics = rollout_metrics(trajs)
    env = {k: v for k, v in metrics.items() if k.startswith("env/")}
    assert env == {"env/Tools/tool_calls": 2.5, "env/Tools/tool_errors": 1.0, "env/Sokoban/boxes_on_target": 1.0}
    assert rollout_metrics(trajs, "val")["val/env/Tools/tool_calls"] == 2.5


def test_token_counts_count_what_the_model_generated():
    """A reply cut at its 12-token cap gets an end-of-turn token appended (not generated, not trained on): the
    per-turn count is 12 for it, not 13."""
    cut = Turn([1], list(range(12)) + [99], [-0.1] * 12, "", finish_reason="length", appended_eos=True)
    stopped = Turn([1], [5, 6, 99], [-0.1] * 3, "")
    metrics = rollout_metrics([Trajectory("t", 0, 0, "A", 0, turns=[cut, stopped])])
    assert metrics["rollout/generated_tokens"] == 15.0 and metrics["rollout/response_tokens_per_turn"] == 7.5


def test_batching_generator_merges_clients():
    inner = _CountingInner()
    batcher = DynamicBatcher(inner, max_batch_size=64, max_wait_ms=10_000)
    batcher.open(8)
    results = {}

    def client(i: int) -> None:
        results[i] = batcher.generate([[i], [100 + i]], None, 4)
        batcher.leave()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert inner.calls == [16]  # all 8 clients' requests in one call
    assert all([o.token_ids for o in results[i]] == [[i], [100 + i]] for i in range(8))  # answers routed back
    assert batcher.get_stats()["calls"] == 1


@pytest.fixture(scope="module")
def infer_group(tiny_model_dir):
    from roll.config.worker import WorkerConfig
    from roll.distributed.group import LocalWorkerGroup

    worker = WorkerConfig()
    worker.model_args.model_name_or_path = tiny_model_dir
    worker.strategy_args.strategy_name = "hf_infer"
    from roll.distributed.roles import InferProxy
    from roll.strategies.registry import strategy_spec

    infer = InferProxy(LocalWorkerGroup("actor_infer", worker, num_threads=1), strategy_spec("hf_infer"))
    infer.initialize(StrategyContext(seed=0))
    return infer


class _Counting(RoleBackend):
    """A real RoleBackend that records the size of every generate call it makes."""

    def __init__(self, group):
        super().__init__(group)
        self.calls: list[int] = []

    def generate(self, prompts, args, max_new_tokens=None):
        self.calls.append(len(prompts))
        return super().generate(prompts, args, max_new_tokens)


def test_requests_of_many_env_managers_land_in_one_generate_call(infer_group, tiny_model_dir):
    cfg = make_cfg(
        group_size=2, env_groups=4, managers=4, max_actions=3, max_tokens=4, batch=8, batch_max_wait_ms=30_000
    )
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    counting = _Counting(infer_group)
    sched.batcher.inner = counting
    trajs, metrics = sched.rollout(1, 8)
    assert len(trajs) == 8 and all(len(t.turns) == 3 for t in trajs)
    assert counting.calls == [8, 8, 8]  # one call per turn holding all 4 managers' 8 envs
    assert metrics["rollout/generate_calls"] == 3 and metrics["rollout/prompts_per_generate_call"] == 8
    for key in ("time/rollout_generate", "time/rollout_env", "time/rollout_idle"):
        assert metrics[key] >= 0.0
    assert metrics["time/rollout_generate"] > 0.0 and metrics["time/rollout_env"] > 0.0


@pytest.mark.slow
def test_failing_and_hanging_envs_are_isolated_and_counted(infer_group, tiny_model_dir):
    FlakyEnv.reset_log()
    cfg = make_cfg(
        env_config={"fail_every": 10, "hang_every": 10, "hang_s": 3.0},
        group_size=4,
        env_groups=4,
        max_actions=3,
        max_tokens=4,
        batch=16,
        env_step_timeout=1.0,
        max_refill_rounds=0,
        raise_env_errors=False,
    )
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    trajs, metrics = sched.rollout(1, 16)
    assert metrics["rollout/env_failures"] == FlakyEnv.faults.count("error") > 0
    assert metrics["rollout/env_timeouts"] == FlakyEnv.faults.count("timeout") > 0
    assert metrics["rollout/envs_replaced"] == metrics["rollout/env_timeouts"]
    failed = int(metrics["rollout/env_failures"] + metrics["rollout/env_timeouts"])
    assert len(trajs) == 16 - failed - metrics["rollout/dropped_trajectories"] == metrics["rollout/batch_size"]
    assert all(t.failure is None for t in trajs)
    sizes = {}
    for t in trajs:
        sizes[t.group_id] = sizes.get(t.group_id, 0) + 1
    assert min(sizes.values()) >= 2  # a group left with one member was dropped
    batch = trajectories_to_batch(trajs, 0)  # the smaller batch still makes a training batch
    assert len(batch) == len(trajs)
    # the next rollout runs on replaced envs and completes too
    trajs2, metrics2 = sched.rollout(2, 16)
    assert metrics2["rollout/batch_size"] == len(trajs2) > 0


def test_local_mode_isolates_env_errors_unless_every_env_fails(infer_group, tiny_model_dir):
    FlakyEnv.reset_log()
    cfg = make_cfg(
        env_config={"fail_every": 5},
        group_size=2,
        env_groups=4,
        max_actions=2,
        max_tokens=4,
        batch=4,
        max_refill_rounds=3,
    )
    assert cfg.train_env_manager.raise_env_errors is False
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    trajs, metrics = sched.rollout(1, 4)
    assert metrics["rollout/env_failures"] == metrics["rollout/env_errors/RuntimeError"] == len(sched.failed) > 0
    assert all(t.failure_at.endswith("in _fault") and "helpers.py" in t.failure_at for t in sched.failed)
    FlakyEnv.reset_log()
    broken = make_cfg(
        env_config={"fail_every": 1},
        group_size=2,
        env_groups=2,
        max_actions=2,
        max_tokens=4,
        batch=4,
        max_refill_rounds=1,
    )
    sched = RolloutScheduler(broken, broken.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    with pytest.raises(RuntimeError) as info:
        sched.rollout(1, 4)
    assert str(info.value).startswith(
        "train rollout at step 1: no usable trajectories: 8 of 8 trajectories failed "
        "(8 raised or returned a non-finite reward, 0 timed out"
    ), str(info.value)
    assert "0 finished" in str(info.value) and "injected env failure" in str(info.value)
    assert "fix the env" in str(info.value) and "env_step_timeout if" not in str(info.value)


def test_max_traj_per_env_caps_the_rounds_of_a_step(infer_group, tiny_model_dir):
    """16 trajectories from 8 envs take two rounds (two trajectories per env); max_traj_per_env=1 stops after one
    round (a short batch), and also stops refills after env failures."""
    cfg = make_cfg(group_size=4, env_groups=2, max_actions=1, max_tokens=4, batch=16, max_traj_per_env=2)
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    trajs, _ = sched.rollout(1, 16)
    assert len(trajs) == 16 and {t.traj_id.rsplit("-", 1)[0] for t in trajs} == {
        f"train-{1000 + r}-g{g}-e{e}" for r in (0, 1) for g in (0, 1) for e in range(4)
    }
    cfg.train_env_manager.max_traj_per_env = 1
    capped = RolloutScheduler(cfg, cfg.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False)
    trajs, metrics = capped.rollout(1, 16)
    assert len(trajs) == 8 and metrics["rollout/refill_rounds"] == 0
    FlakyEnv.reset_log()
    flaky = make_cfg(
        {"fail_every": 5},
        group_size=4,
        env_groups=2,
        max_actions=1,
        max_tokens=4,
        batch=8,
        max_refill_rounds=3,
        raise_env_errors=False,
        max_traj_per_env=1,
    )
    trajs, metrics = RolloutScheduler(
        flaky, flaky.train_env_manager, "train", tiny_model_dir, infer_group, use_ray=False
    ).rollout(1, 8)
    assert metrics["rollout/env_failures"] > 0 and metrics["rollout/refill_rounds"] == 0 and len(trajs) < 8
