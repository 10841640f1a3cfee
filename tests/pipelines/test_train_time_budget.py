"""``max_train_minutes``: the loop stops at the first step past the training-time budget, and that step ends the
run as ``max_steps`` would (validation, log, final export); the budget bounds the warm start too, and checkpoints
keep the time spent."""

from __future__ import annotations

import json
from pathlib import Path

from roll.config.loader import load_config
from roll.config.rlvr import RLVRConfig
from roll.pipelines.rlvr_pipeline import RLVRPipeline


def _run(model_dir: str, out: Path, *extra: str) -> list[dict]:
    """A tiny RLVR run in local mode; its metric rows."""
    overrides = [
        f"pretrain={model_dir}",
        "tiny_model=null",
        f"output_dir={out}",
        f"logging_dir={out}/logs",
        "distributed=local",
        "track_with=stdout",
        "save_steps=0",
        "rollout_dump_steps=0",
        "rollout_batch_size=2",
        "num_return_sequences_in_group=2",
        "dynamic_sampling.enabled=false",
        "is_use_additional_prompts=false",
        "rewards.num_workers=1",
        "actor_infer.generating_args.max_new_tokens=4",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "actor_train.num_cpus_per_worker=1",
        "actor_infer.num_cpus_per_worker=1",
        *extra,
    ]
    RLVRPipeline(load_config("rlvr_tiny", overrides=overrides, schema=RLVRConfig)).run()
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_budget_stops_after_the_step_that_exceeds_it(tiny_model_dir, tmp_path, capsys):
    rows = _run(
        tiny_model_dir,
        tmp_path,
        "max_steps=50",
        "eval_steps=40",
        "sft_warmup.enabled=false",
        "validation.max_samples=4",
        "max_train_minutes=1e-6",
    )  # any step takes longer than 60 microseconds
    steps = sorted({r["step"] for r in rows})
    assert steps == [0, 1]  # the step-0 validation, then step 1, the last
    last = {k: v for r in rows if r["step"] == 1 for k, v in r.items()}
    assert "time/step" in last and any(k.startswith("val/") for k in last)  # validated as a final step
    assert (tmp_path / "final" / "config.json").exists()
    assert "max_train_minutes=1e-06 reached after step 1" in capsys.readouterr().out


def test_a_warm_start_that_spends_the_budget_ends_the_run(tiny_model_dir, tmp_path):
    """The budget bounds the supervised warm start too (the same-time SFT control of benchmarks/rl_vs_sft.py): it
    stops after the step that reaches it, logs how many steps ran, and no RL step follows."""
    rows = _run(
        tiny_model_dir,
        tmp_path,
        "max_steps=50",
        "eval_steps=0",
        "sft_warmup.steps=40",
        "sft_warmup.batch_size=4",
        "validation.file_name=[]",
        "max_train_minutes=1e-6",
    )
    assert {r["step"] for r in rows} == {0}
    assert next(r["sft/steps"] for r in rows if "sft/steps" in r) == 1
    assert (tmp_path / "final" / "config.json").exists()


def test_checkpoints_keep_the_time_spent(tiny_model_dir, tmp_path):
    """A resumed run goes on counting: a checkpoint holds the training seconds so far, and a run resumed with a
    budget those seconds already exceed trains no further step."""
    from roll.pipelines import checkpoint as ckpt

    base = ["eval_steps=0", "save_steps=1", "sft_warmup.enabled=false", "validation.file_name=[]"]
    _run(tiny_model_dir, tmp_path, *base, "max_steps=2")
    spent = ckpt.read_state(ckpt.resolve_resume(True, tmp_path))["train_seconds"]
    assert spent > 0
    rows = _run(
        tiny_model_dir,
        tmp_path,
        *base,
        "max_steps=4",
        "resume_from_checkpoint=true",
        f"max_train_minutes={spent / 120}",
    )
    assert max(r["step"] for r in rows) == 2  # no step 3: the budget was spent before the resume
