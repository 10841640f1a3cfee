"""benchmarks/soak.py: a real driver process killed with SIGKILL and resumed logs every step once, with the metrics of
an uninterrupted run; faulty envs (errors, hangs past env_step_timeout, calls that never return, more of them than
env threads) are counted and change nothing of that."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("bench_soak", Path(__file__).parents[2] / "benchmarks" / "soak.py")
soak = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_soak"] = soak  # its dataclasses look their module up
_SPEC.loader.exec_module(soak)

STEPS, KILLS = 4, [1, 3]  # a kill before the first checkpoint (save_steps=2) and one after it (logs rewound)


def small(run_dir: Path, model_dir: str) -> list[str]:
    """The soak config shrunk further for the test suite: no warm start, no validation, 8 trajectories a step,
    episodes of at most 4 actions."""
    overrides = soak.soak_overrides(
        run_dir, STEPS, save_steps=2, fault_seed=0, error_rate=0.10, hang_rate=0.02, never_rate=0.05
    )
    overrides.update(
        {
            "pretrain": model_dir,
            "tiny_model": "null",
            "sft_warmup.enabled": "false",
            "eval_steps": "0",
            "rollout_batch_size": "8",
            "train_env_manager.env_groups": "2",
            "custom_envs.SimpleSokoban.max_actions_per_traj": "4",
            "actor_train.training_args.gradient_accumulation_steps": "1",
        }
    )
    return soak.as_args(overrides)


@pytest.mark.slow
def test_sigkilled_driver_resumes_with_each_step_logged_once_and_equal_metrics(tmp_path, tiny_model_dir):
    # the reference runs beside the killed one (their own folders): while one waits out env timeouts (hangs,
    # calls that never return) the other computes; each run's steps and checks are unchanged
    with ThreadPoolExecutor(1) as pool:
        straight = pool.submit(
            soak.run_with_kills,
            small(tmp_path / "reference", tiny_model_dir),
            tmp_path / "reference",
            [],
            random.Random(0),
        )
        killed = soak.run_with_kills(
            small(tmp_path / "soak", tiny_model_dir), tmp_path / "soak", KILLS, random.Random(0)
        )
        reference = straight.result()
    assert len(reference.launches) == 1
    assert [launch.killed_after_step for launch in killed.launches] == KILLS + [None]
    assert [launch.resumed for launch in killed.launches] == [False] + [True] * len(KILLS)
    figures = soak.compare(tmp_path / "reference", tmp_path / "soak")
    assert figures["problems"] == 0
    assert figures["steps"] == STEPS and figures["values_compared"] > 100
    assert figures["env_failures"] > 0 and figures["env_timeouts"] > 0  # the faults happened and were counted
    assert figures["injected_faults"] == figures["env_failures"]  # by type, too
    never = [
        line
        for line in (tmp_path / "reference" / "launch_0.log").read_text().splitlines()
        if "no return within env_step_timeout" in line
    ]
    assert never, "no call timed out"  # printed once per step, with the env tag and seed
    # a kill after a step that follows a checkpoint means the resumed run rewound the logs: said in its output
    logs = "".join((tmp_path / "soak" / f"launch_{i}.log").read_text() for i in range(1, len(KILLS) + 1))
    assert "resumed from" in logs and "dropped" in logs
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "soak" / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, STEPS + 1))


def test_compare_flags_a_duplicated_step_and_a_changed_metric(tmp_path):
    """The checker the soak relies on fails where it must."""
    for name in ("a", "b"):
        (tmp_path / name / "logs").mkdir(parents=True)
    rows = [{"step": s, "timestamp": 1.0, "rollout/x": 0.5 * s, "time/step": 1.0} for s in (1, 2, 3)]
    (tmp_path / "a" / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    same = [dict(r, timestamp=2.0, **{"time/step": 9.0}) for r in rows]
    (tmp_path / "b" / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in same))
    assert soak.compare(tmp_path / "a", tmp_path / "b")["problems"] == 0  # time and timestamps are not compared
    bad = same[:2] + [same[1], dict(same[2], **{"rollout/x": 1.6})]
    (tmp_path / "b" / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    assert soak.compare(tmp_path / "a", tmp_path / "b")["problems"] >= 1
