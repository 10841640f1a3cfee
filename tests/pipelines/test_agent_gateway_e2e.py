"""The shipped gateway example (examples/config/sokoban_agent_tiny.yaml: an OpenAI-API Sokoban harness through
the gateway) through the real start script on CPU, shrunk to one step: it trains, the trainer's log-probs match
the ones the gateway recorded, and no episode fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_example(tmp_path: Path, model: str, *extra: str) -> dict[int, dict]:
    """``sokoban_agent_tiny`` through the start script, 16 episodes a step; returns each step's merged metrics."""
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-name",
        "sokoban_agent_tiny",
        f"pretrain={model}",
        "distributed=local",
        "eval_steps=0",
        "sft_warmup.enabled=false",
        "rollout_batch_size=16",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=8",
        "val_env_manager=null",
        "save_steps=0",
        "trajectory_dump_steps=0",
        "zero_signal_patience=0",
        "max_train_minutes=0",
        f"output_dir={tmp_path / 'out'}",
        f"logging_dir={tmp_path / 'out' / 'logs'}",
        *extra,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
    }
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps: dict[int, dict] = {}
    for line in (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], {}).update(row)
    return steps


@pytest.mark.slow
def test_gateway_example_trains_one_step(tmp_path, tiny_model_dir):
    step = run_example(tmp_path, tiny_model_dir, "max_steps=1")[1]
    assert step["rollout/batch_size"] == 16 and step["rollout/env_failures"] == 0
    assert step["env/SimpleSokoban/turns"] >= 1 and step["env/SimpleSokoban/template_breaks"] == 0
    assert step["rollout/logprob_mismatch_max"] < 1e-4  # what the trainer recomputes is what the gateway recorded
    assert "actor/pg_loss" in step


@pytest.mark.slow
def test_gateway_example_trains_asynchronously(tmp_path, tiny_model_dir):
    """The gateway under ``async_generation_ratio=1``: the harnesses keep playing while the actor trains, every
    step trains a full batch of gateway episodes at most one version old, and the producers did run ahead."""
    steps = run_example(tmp_path, tiny_model_dir, "max_steps=3", "async_generation_ratio=1")
    trained = [steps[s] for s in (1, 2, 3)]
    assert all(r["rollout/batch_size"] == 16 and r["rollout/env_failures"] == 0 for r in trained)
    assert all(r["rollout/staleness_max"] <= 1 and "actor/pg_loss" in r for r in trained)
    assert max(r["rollout/staleness_max"] for r in trained) == 1  # a batch made while the previous one trained
    assert trained[0]["rollout/logprob_mismatch_max"] < 1e-4  # step 1's batch is fresh: recorded = recomputed
