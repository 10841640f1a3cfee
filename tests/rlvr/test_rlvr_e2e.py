"""End to end: the real start script runs 2 RLVR steps through Ray (reward actors), DeepSpeed and hf_infer;
and a malformed data file stops the CLI before any worker starts, naming the rows."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "examples" / "start_rlvr_pipeline.py")


def small_run_overrides(tmp: Path, model_dir: str) -> list[str]:
    return [
        f"pretrain={model_dir}",
        "tiny_model=null",
        f"output_dir={tmp}/out",
        f"logging_dir={tmp}/logs",
        "max_steps=2",
        "save_steps=1",
        "eval_steps=1",
        "track_with=tensorboard",
        "rollout_dump_steps=1",
        "sft_warmup.steps=2",
        "sft_warmup.batch_size=8",
        "rollout_batch_size=4",
        "num_return_sequences_in_group=4",
        "max_additional_running_prompts=4",
        "validation.max_samples=8",
        "rewards.num_workers=2",
        "actor_train.training_args.per_device_train_batch_size=8",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "actor_train.num_cpus_per_worker=1",
        "actor_infer.num_cpus_per_worker=1",
    ]


@pytest.mark.slow
def test_two_steps_through_ray_deepspeed_hf_infer(tmp_path, tiny_model_dir):
    cmd = [sys.executable, SCRIPT, "--config-name", "rlvr_tiny", *small_run_overrides(tmp_path, tiny_model_dir)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    by_step: dict = {}
    for r in rows:
        by_step.setdefault(r["step"], {}).update(r)
    assert sorted(by_step) == [0, 1, 2]
    assert by_step[0]["sft/first_loss"] > 0 and "val/accuracy" in by_step[0]
    for step in (1, 2):
        row = by_step[step]
        for key in (
            "rollout/accuracy",
            "rollout/mean_reward",
            "rollout/response_length",
            "actor/pg_loss",
            "actor/grad_norm",
            "critic/advantages_mean",
            "dynamic_sampling/groups_filtered",
            "dynamic_sampling/batch_groups",
            "val/accuracy",
            "val/math/accuracy",
            "time/rollout",
            "time/train",
            "time/sync",
        ):
            assert key in row and row[key] is not None and math.isfinite(row[key]), (step, key)
        assert row["dynamic_sampling/batch_groups"] == 4
        assert row["dynamic_sampling/prompts_drawn"] <= 4 + 4
        assert 0 <= row["val/accuracy"] <= 1
        # hf_infer sampled with the weights the trainer scored them with (fp32): the same log-probs up to kernels
        assert 0 <= row["rollout/logprob_mismatch"] <= row["rollout/logprob_mismatch_max"] < 1e-3, row
    dumps = tmp_path / "logs" / "trajectories"
    dump = [json.loads(line) for line in (dumps / "train" / "step_00001.jsonl").read_text().splitlines()]
    assert len(dump) == 16 and sorted({d["group"] for d in dump}) == [0, 1, 2, 3]  # 4 prompts x 4 responses
    assert all(d["score"] == float(d["success"]) for d in dump)  # format_reward 0
    assert all(len(d["turns"][0]["adv"]) == len(d["turns"][0]["tokens"]) > 0 for d in dump)
    assert len((dumps / "val" / "step_00002.jsonl").read_text().splitlines()) == 8  # validation.max_samples
    assert (tmp_path / "logs" / "metrics.png").is_file()
    assert list((tmp_path / "logs").rglob("events.out.tfevents*"))

    first = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "checkpoints" / "step_1" / "actor_hf")
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final")
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any((a - b).abs().max().item() > 0 for a, b in zip(first.parameters(), start.parameters()))
    assert any((a - b).abs().max().item() > 0 for a, b in zip(final.parameters(), first.parameters()))

    # resume from the newest complete checkpoint (step 2) for one more step, in-process workers this time
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir()) == ["step_1", "step_2"]
    cmd += ["max_steps=3", "resume_from_checkpoint=true", "distributed=local", "save_steps=0"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "step_2" in proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/accuracy" in r] == [1, 2, 3]
    assert "sft/first_loss" not in rows[-1]  # no second warm start


def test_malformed_data_stops_cli_before_workers(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"prompt": "What is 1 + 1?", "ground_truth": "2", "tag": "math"}\n'
        '{"prompt": "", "ground_truth": "2", "tag": "math"}\n'
    )
    proc = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--config-name",
            "rlvr_tiny",
            f"actor_train.data_args.file_name=[{bad}]",
            f"output_dir={tmp_path}/out",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "actor_train.data_args.file_name" in proc.stderr and "row 1 (line 2): empty prompt" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_untagged_data_and_no_validation_block(tmp_path, tiny_model_dir):
    """Data without a tag column runs with ``default_tag``; ``validation: null`` runs no validation."""
    rows = [json.loads(line) for line in (REPO / "data" / "math_tiny" / "train.jsonl").read_text().splitlines()]
    untagged = tmp_path / "untagged.jsonl"
    untagged.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "tag"}) + "\n" for r in rows[:64]))
    overrides = [o for o in small_run_overrides(tmp_path, tiny_model_dir) if not o.startswith("validation.")]
    cmd = [
        sys.executable,
        SCRIPT,
        "--config-name",
        "rlvr_tiny",
        *overrides,
        "max_steps=1",
        "save_steps=0",
        "distributed=local",
        f"actor_train.data_args.file_name=[{untagged}]",
        "default_tag=math",
        "validation=null",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "rollout/accuracy" in m] == [1]
    assert "rollout/math/accuracy" in metrics[-1]  # every row got the default tag
    assert not any(k.startswith("val/") for m in metrics for k in m)
