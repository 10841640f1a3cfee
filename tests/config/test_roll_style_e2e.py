"""ROLL-style configs (defaults list with DeepSpeed fragments, worker blocks, env manager blocks) run two steps on
CPU with the tiny model through the real start scripts (distributed=local, DeepSpeed ZeRO-2 on gloo, hf_infer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_script(script: str, config: str, overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(REPO / "examples" / script),
        "--config_path",
        "roll_style",
        "--config_name",
        config,
        *overrides,
    ]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


def metrics(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_roll_style_agentic_two_steps(tmp_path, tiny_model_dir):
    peak, warmup = 1.0e-3, 10
    proc = run_script(
        "start_agentic_pipeline.py",
        "agentic_sokoban",
        [
            f"pretrain={tiny_model_dir}",
            "tiny_model=null",
            "distributed=local",
            f"output_dir={tmp_path}/out",
            f"logging_dir={tmp_path}/logs",
            f"render_save_dir={tmp_path}/render",
            "max_steps=2",
            "eval_steps=2",
            "rollout_batch_size=8",
            "val_batch_size=2",
            "train_env_manager.env_groups=2",
            "train_env_manager.n_groups=[2]",
            "train_env_manager.group_size=4",
            "val_env_manager.env_groups=2",
            "val_env_manager.n_groups=[2]",
            "max_actions_per_traj=3",
            "max_tokens_per_step=6",
            "sequence_length=512",  # YAML variables
            "reward_normalization.method=identity",
            # the guide's rule: gradient_accumulation_steps = 8 samples / (4 x 1 worker) = 2 -> one optimizer step
            "actor_train.training_args.per_device_train_batch_size=4",
            "actor_train.training_args.gradient_accumulation_steps=2",
            f"actor_train.training_args.learning_rate={peak}",
            f"actor_train.training_args.warmup_steps={warmup}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["step"]: r for r in metrics(tmp_path / "logs")}
    assert {1, 2} <= set(rows)
    # One optimizer step per rollout: in linear warmup the k-th optimizer step uses peak * k / warmup, so step 1
    # trains at peak / 10 and step 2 at 2 * peak / 10 (two steps per rollout would log 1.5 and 3.5 tenths).
    assert rows[1]["actor/lr"] == pytest.approx(peak * 1 / warmup)
    assert rows[2]["actor/lr"] == pytest.approx(peak * 2 / warmup)
    assert "val/success_rate" in rows[2]
    # render_save_dir: validation episodes replayed with Sokoban's rgb_array render, one PNG per state.
    episodes = sorted((tmp_path / "render" / "step_00002").iterdir())
    assert len(episodes) == 2
    for episode in episodes:
        info = json.loads((episode / "episode.json").read_text())
        frames = sorted(episode.glob("frame_*.png"))
        assert info["render_mode"] == "rgb_array" and info["replay_consistent"]
        assert 2 <= len(frames) == len(info["rewards"]) + 1 <= 4
    assert (tmp_path / "out" / "final" / "config.json").is_file()


@pytest.mark.slow
def test_roll_style_rlvr_two_steps(tmp_path, tiny_model_dir):
    proc = run_script(
        "start_rlvr_pipeline.py",
        "rlvr_math",
        [
            f"pretrain={tiny_model_dir}",
            "tiny_model=null",
            "distributed=local",
            f"output_dir={tmp_path}/out",
            f"logging_dir={tmp_path}/logs",
            "max_steps=2",
            "eval_steps=0",
            "rollout_batch_size=4",
            "num_return_sequences_in_group=4",
            "validation.file_name=[]",
            "rewards.num_workers=1",
            # 4 prompts x 4 responses / (8 x 1 worker) = 2 -> one optimizer step per rollout
            "actor_train.training_args.per_device_train_batch_size=8",
            "actor_train.training_args.gradient_accumulation_steps=2",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["step"]: r for r in metrics(tmp_path / "logs")}
    assert {1, 2} <= set(rows)
    assert all("actor/lr" in rows[s] for s in (1, 2))
