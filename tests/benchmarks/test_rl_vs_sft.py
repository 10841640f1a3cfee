"""benchmarks/rl_vs_sft.py --side-by-side: a seed's control starts once its RL run is done, from the same initial
model, with the RL run's measured training time as its budget; the table reads both."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
_SPEC = importlib.util.spec_from_file_location("bench_rl_vs_sft", ROOT / "benchmarks" / "rl_vs_sft.py")
rl_vs_sft = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(rl_vs_sft)

TINY = [
    "distributed=local",
    "tiny_model.hidden_size=32",
    "tiny_model.intermediate_size=64",
    "tiny_model.num_hidden_layers=1",
    "max_steps=2",
    "eval_steps=2",
    "save_steps=0",
    "trajectory_dump_steps=0",
    "track_with=stdout",
    "sft_warmup.steps=4",
    "sft_warmup.batch_size=4",
    "rollout_batch_size=8",
    "train_env_manager.env_groups=2",
    "train_env_manager.group_size=4",
    "val_env_manager.env_groups=8",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "actor_train.num_cpus_per_worker=1",
    "actor_infer.num_cpus_per_worker=1",
]


@pytest.mark.slow
def test_side_by_side_gives_each_control_its_rl_runs_time(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "rl_vs_sft.py"), "--seeds", "1", "--out", str(tmp_path)]
    proc = subprocess.run([*cmd, "--side-by-side", "1", "--", *TINY], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| 1 |" in proc.stdout and "RL - warm start: mean" not in proc.stdout  # one seed: a row, no mean
    (row,) = json.loads((tmp_path / "summary.json").read_text())
    assert row["rl_steps"] == 2 and row["episodes"] == 8
    # the control's command line: the RL run's initial model and its measured training time as the budget
    assert f"pretrain={tmp_path.resolve() / 'seed1' / 'rl' / 'model'}" in proc.stdout
    assert f"max_train_minutes={row['rl_train_s'] / 60:.4f}" in proc.stdout
    assert row["control_sft_steps"] >= 4  # at least the warm start's steps fit in the RL run's time


def test_the_control_is_ended_by_its_budget_not_its_step_limit(tmp_path):
    """The control's step limit is 4x what the RL run's warm-start pace predicts (a warm start slowed by other work
    underestimates the pace), its demonstrations 1.5x, and its budget the RL run's training time. Here the warm start
    did 100 steps in 10 s and RL 5 steps of 2 s: 20 s of training, 200 steps at that pace."""
    import argparse

    rl_dir = tmp_path / "rl"
    (rl_dir / "logs").mkdir(parents=True)
    rows = [{"step": 0, "time/sft": 10.0}] + [{"step": k, "time/step": 2.0} for k in range(1, 6)]
    (rl_dir / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = argparse.Namespace(extra=["sft_warmup.steps=7", "max_steps=5"])
    own = rl_vs_sft.control_args(args, 1, rl_dir, tmp_path / "control", sft_steps=100, batch=16)
    assert "sft_warmup.steps=800" in own and "sft_warmup.num_demos=4800" in own  # 4 x 200 steps, 1.5 x 200 x 16
    assert "max_train_minutes=0.3333" in own and "max_steps=0" in own
    assert "sft_warmup.steps=7" not in own and "max_steps=5" not in own  # the control's values replace the study's
