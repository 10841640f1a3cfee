"""Config-level placement and checkpoint rules (ConfigError naming key, value and fix)."""

from __future__ import annotations

import pytest

from roll.config.errors import ConfigError
from roll.config.loader import load_config

BASE = ["distributed=local", "tiny_model=null", "pretrain=/nonexistent"]


def _load(*overrides: str):
    return load_config("sokoban_tiny", overrides=[*BASE, *overrides])


def test_gpu_run_needs_every_role_mapped():
    with pytest.raises(ConfigError, match=r"actor_infer.device_mapping=.*empty while actor_train run on GPUs"):
        _load("num_gpus_per_node=2", "actor_train.device_mapping=[0,1]")


def test_worker_must_not_span_nodes():
    with pytest.raises(ConfigError, match=r"worker 0 gets GPUs \[1, 2\] on several nodes"):
        _load(
            "num_nodes=2",
            "num_gpus_per_node=2",
            "actor_train.device_mapping=[0]",
            "actor_infer.device_mapping=[1,2]",
            "actor_infer.num_gpus_per_worker=2",
        )


def test_colocated_gpu_mapping_sets_world_size():
    cfg = _load(
        "num_gpus_per_node=2",
        "actor_train.device_mapping='list(range(0,2))'",
        "actor_infer.device_mapping=[0,1]",
        "actor_train.training_args.per_device_train_batch_size=8",
        "actor_train.training_args.gradient_accumulation_steps=2",
        "sft_warmup.batch_size=32",
    )
    assert cfg.actor_train.world_size == 2 and cfg.actor_infer.world_size == 2


def test_checkpoint_keys():
    with pytest.raises(ConfigError, match=r"checkpoint_config=.*unknown keys \['keep'\]"):
        _load("+checkpoint_config.keep=2")
    with pytest.raises(ConfigError, match="save_steps=-1"):
        _load("save_steps=-1")
    assert _load("resume_from_checkpoint=true").resume_from_checkpoint is True
