"""End to end: the real start script runs 3 agentic steps through Ray + DeepSpeed (ZeRO-2, gloo) + hf_infer."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]


def small_run_overrides(tmp: Path, model_dir: str) -> list[str]:
    return [
        f"pretrain={model_dir}",
        f"output_dir={tmp}/out",
        f"logging_dir={tmp}/logs",
        "max_steps=3",
        "save_steps=1",
        "eval_steps=0",
        "track_with=tensorboard",
        "trajectory_dump_steps=1",
        "checkpoint_config.max_to_keep=0",  # every checkpoint kept (the default keeps 2): the test reads step 1
        "sft_warmup.enabled=false",
        "rollout_batch_size=8",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=4",
        "val_env_manager=null",
        # identity normalization keeps raw (negative) scores, so an untrained policy still gets a gradient
        "reward_normalization.method=identity",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "actor_train.num_cpus_per_worker=1",
        "actor_infer.num_cpus_per_worker=1",
        "custom_envs.SimpleSokoban.max_actions_per_traj=3",
        "custom_envs.SimpleSokoban.max_tokens_per_step=6",
        "sequence_length=512",
    ]


@pytest.mark.slow
def test_three_steps_through_ray_deepspeed_hf_infer(tmp_path, tiny_model_dir):
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-name",
        "sokoban_tiny",
        *small_run_overrides(tmp_path, tiny_model_dir),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        for key in (
            "rollout/success_rate",
            "rollout/mean_reward",
            "rollout/invalid_action_rate",
            "rollout/mean_actions",
            "actor/pg_loss",
            "actor/grad_norm",
            "time/rollout",
            "time/train",
            "time/sync",
        ):
            assert key in row and row[key] is not None and math.isfinite(row[key]), key
    assert list((tmp_path / "logs").glob("events.out.tfevents*")) or list((tmp_path / "logs").rglob("events*"))
    assert (tmp_path / "logs" / "trajectories" / "train" / "step_00001.jsonl").is_file()

    first = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "checkpoints" / "step_1" / "actor_hf")
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final")
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    deltas = [(a - b).abs().max().item() for a, b in zip(final.parameters(), first.parameters())]
    assert max(deltas) > 0, "RL steps 2-3 did not change the weights"
    assert any((a - b).abs().max().item() > 0 for a, b in zip(first.parameters(), start.parameters()))
    ids = torch.tensor([[1, 2, 3]])
    assert torch.isfinite(final(ids).logits).all()
