"""Asynchronous rollouts end to end (CPU, tiny model): with ``async_generation_ratio`` k the agentic and RLVR
pipelines train on groups at most k policy versions old, the buffer never holds more than (k + 1) x the batch's
groups, nothing is dropped when groups finish in order, and the batches really come from older weights (the
staleness reaches k; the engine's log-probs differ from the trainer's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.config.loader import load_config

STEPS = 5


def _agentic(model_dir: str, out: Path, k: int, *extra: str, distributed: str = "local"):
    overrides = [
        f"pretrain={model_dir}", "tiny_model=null", f"output_dir={out}", f"logging_dir={out}/logs",
        f"distributed={distributed}", "track_with=stdout", f"max_steps={STEPS}", "save_steps=0", "eval_steps=0",
        "trajectory_dump_steps=0", "sft_warmup.enabled=false", "rollout_batch_size=8", "sequence_length=256",
        "train_env_manager.env_groups=2", "train_env_manager.group_size=4", "val_env_manager=null",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1", "actor_train.training_args.learning_rate=1e-3",
        "actor_train.num_cpus_per_worker=1", "actor_infer.num_cpus_per_worker=1",
        "custom_envs.SimpleSokoban.max_actions_per_traj=3", "actor_infer.generating_args.max_new_tokens=6",
        "custom_envs.SimpleSokoban.max_tokens_per_step=6", "zero_signal_patience=0",
        "reward_normalization.grouping=batch", "reward_normalization.method=identity", "entropy_loss_coef=0.01",
        f"async_generation_ratio={k}", *extra]
    return load_config("sokoban_tiny", overrides=overrides)


def _rows(out: Path) -> dict[int, dict]:
    by_step: dict[int, dict] = {}
    for line in (out / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


def _check_bound(rows: dict[int, dict], k: int, batch_groups: int) -> None:
    steps = [rows[s] for s in range(1, STEPS + 1)]
    assert all(r["rollout/staleness_max"] <= k for r in steps), [r["rollout/staleness_max"] for r in steps]
    assert all(r["rollout/buffered_groups_peak"] <= (k + 1) * batch_groups for r in steps)
    assert all(r["rollout/dropped_groups"] == 0 for r in steps)
    assert max(r["rollout/staleness_max"] for r in steps) == k  # the producers really ran ahead
    assert all(r["rollout/batch_size"] == 8 for r in steps)


@pytest.mark.parametrize("k", [1, 2])
def test_agentic_staleness_stays_within_k(tiny_model_dir, tmp_path, k):
    from roll.pipelines.agentic_pipeline import AgenticPipeline

    AgenticPipeline(_agentic(tiny_model_dir, tmp_path, k)).run()
    rows = _rows(tmp_path)
    _check_bound(rows, k, batch_groups=2)
    # step 1 trains the start weights' own groups; later batches come from older weights than the trained ones
    assert rows[1]["rollout/logprob_mismatch_max"] < 1e-4
    assert rows[STEPS]["rollout/logprob_mismatch"] > 1e-3


@pytest.mark.slow
def test_agentic_async_under_ray(tiny_model_dir, tmp_path):
    """Ray mode: env managers are actors, the producers' rounds are remote calls (two managers, one group each)."""
    from roll.pipelines.agentic_pipeline import AgenticPipeline

    AgenticPipeline(_agentic(tiny_model_dir, tmp_path, 1, "train_env_manager.num_env_managers=2",
                             distributed="ray")).run()
    _check_bound(_rows(tmp_path), 1, batch_groups=2)


def test_rlvr_staleness_stays_within_k(tiny_model_dir, tmp_path):
    from roll.config.rlvr import RLVRConfig
    from roll.pipelines.rlvr_pipeline import RLVRPipeline

    overrides = [
        f"pretrain={tiny_model_dir}", "tiny_model=null", f"output_dir={tmp_path}", f"logging_dir={tmp_path}/logs",
        "distributed=local", "track_with=stdout", f"max_steps={STEPS}", "save_steps=0", "eval_steps=0",
        "rollout_dump_steps=0", "sft_warmup.enabled=false", "rollout_batch_size=2", "num_return_sequences_in_group=4",
        "dynamic_sampling.enabled=false", "is_use_additional_prompts=false", "validation.file_name=[]",
        "rewards.num_workers=1", "actor_infer.generating_args.max_new_tokens=8",
        "actor_train.training_args.per_device_train_batch_size=8",
        "actor_train.training_args.gradient_accumulation_steps=1", "entropy_loss_coef=0.01", "zero_signal_patience=0",
        "actor_train.num_cpus_per_worker=1", "actor_infer.num_cpus_per_worker=1", "async_generation_ratio=2"]
    RLVRPipeline(load_config("rlvr_tiny", overrides=overrides, schema=RLVRConfig)).run()
    rows = _rows(tmp_path)
    steps = [rows[s] for s in range(1, STEPS + 1)]
    assert all(r["rollout/staleness_max"] <= 2 and r["rollout/buffered_groups_peak"] <= 3 * 2 for r in steps)
    assert max(r["rollout/staleness_max"] for r in steps) == 2
    assert [r["rollout/policy_lag"] for r in steps] == [r["rollout/staleness_mean"] for r in steps]
