"""``distributed: local`` and the Ray path give the same run: 2 steps of a tiny config each, same seeds, CPU.

Compared: every non-timing number of metrics.jsonl (rollout, actor, critic/advantage metrics of steps 1-2) and the
final actor weights.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
#: Metric prefixes that measure time, speed or memory (they differ between any two runs), and the weight transport
#: (local mode hands tensors over in-process, Ray copies them: ``sync/mode``, ``sync/buckets`` differ by design).
UNTIMED_EXCLUDE = ("time/", "perf/", "system/", "memory/", "sync/")


def tiny_overrides(tmp: Path, model_dir: str, mode: str) -> list[str]:
    """2 RL steps (no warm start), 8 trajectories of <= 3 turns, DeepSpeed ZeRO-2 + hf_infer, one thread each."""
    return [
        f"distributed={mode}",
        f"pretrain={model_dir}",
        f"output_dir={tmp}/{mode}/out",
        f"logging_dir={tmp}/{mode}/logs",
        "max_steps=2",
        "eval_steps=0",
        "save_steps=0",
        "track_with=stdout",
        "trajectory_dump_steps=0",
        "sft_warmup.enabled=false",
        "val_env_manager=null",
        "rollout_batch_size=8",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=4",
        "sequence_length=512",
        "reward_normalization.method=identity",
        "custom_envs.SimpleSokoban.max_actions_per_traj=3",
        "custom_envs.SimpleSokoban.max_tokens_per_step=6",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "actor_train.num_cpus_per_worker=1",
        "actor_infer.num_cpus_per_worker=1",
        "strict_data_check=true",
    ]


def launch(tmp: Path, model_dir: str, mode: str) -> subprocess.Popen:
    """Start the start script in ``mode`` (both runs go at once: most of each is start-up, not compute)."""
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-name",
        "sokoban_tiny",
        *tiny_overrides(tmp, model_dir, mode),
    ]
    log = open(tmp / f"{mode}.log", "w")
    return subprocess.Popen(
        cmd,
        cwd=tmp,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
    )


def finish(tmp: Path, mode: str, proc: subprocess.Popen) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Wait for a run; return the step rows of metrics.jsonl and the final actor's state dict."""
    from transformers import AutoModelForCausalLM

    try:
        code = proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert code == 0, (tmp / f"{mode}.log").read_text()[-4000:]
    rows = [json.loads(line) for line in (tmp / mode / "logs" / "metrics.jsonl").read_text().splitlines()]
    final = AutoModelForCausalLM.from_pretrained(tmp / mode / "out" / "final")
    return [r for r in rows if r["step"] >= 1], final.state_dict()


def comparable(row: dict) -> dict[str, float]:
    """The numbers of a metrics row that do not measure time, speed or memory."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not k.startswith(UNTIMED_EXCLUDE)}


def assert_same_runs(a: tuple[list[dict], dict], b: tuple[list[dict], dict], rel: float = 1e-5) -> None:
    """Same steps, same metric keys, values equal to ``rel``; final weights equal to 1e-6 absolute."""
    rows_a, weights_a = a
    rows_b, weights_b = b
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == [1, 2]
    for ra, rb in zip(rows_a, rows_b):
        ca, cb = comparable(ra), comparable(rb)
        assert set(ca) == set(cb), set(ca) ^ set(cb)
        for key in ca:
            if ca[key] is None or cb[key] is None:
                assert ca[key] == cb[key], key
                continue
            assert math.isclose(ca[key], cb[key], rel_tol=rel, abs_tol=1e-7), (ra["step"], key, ca[key], cb[key])
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        torch.testing.assert_close(weights_a[name], weights_b[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.slow
def test_local_and_ray_give_same_metrics_and_weights(tmp_path, tiny_model_dir):
    procs = {mode: launch(tmp_path, tiny_model_dir, mode) for mode in ("local", "ray")}
    local, ray = (finish(tmp_path, mode, proc) for mode, proc in procs.items())
    assert_same_runs(local, ray)
    start = initial_state(tiny_model_dir)
    assert any(not torch.equal(start[k], local[1][k]) for k in start), "2 RL steps did not change the weights"
    for row in local[0]:  # the runs trained (not two identical no-ops): a loss and a rollout happened
        assert math.isfinite(row["actor/pg_loss"]) and row["rollout/mean_actions"] > 0


def initial_state(path: str) -> dict[str, torch.Tensor]:
    """The state dict of the model saved at ``path``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()
