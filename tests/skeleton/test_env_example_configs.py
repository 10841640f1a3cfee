"""Every env's example config loads, and trains one agentic step (local mode, tiny settings)."""

import math
from pathlib import Path

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.loader import load_config
from roll.pipelines.agentic_pipeline import AgenticPipeline
from tests.config_cache import cached_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ["sokoban_tiny", "frozen_lake_tiny", "countdown_tiny", "gsm8k_env_tiny", "tool_use_tiny", "guess_number_tiny"]


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # examples.custom_env imports from the repo root, like a launch there


@pytest.mark.parametrize("name", CONFIGS)
def test_example_config_loads(name):
    cfg = cached_config(name, schema=AgenticConfig)
    assert cfg.train_env_manager.tags[0] in cfg.custom_envs
    assert cfg.rollout_batch_size % cfg.train_env_manager.group_size == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_example_config_trains_one_step(name, tmp_path, tiny_model_dir):
    overrides = [
        f"pretrain={tiny_model_dir}",
        f"output_dir={tmp_path}/out",
        f"logging_dir={tmp_path}/logs",
        "distributed=local",
        "max_steps=1",
        "eval_steps=0",
        "val_env_manager=null",
        "track_with=stdout",
        "rollout_batch_size=8",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=4",
        "sft_warmup.steps=2",
        "sft_warmup.num_demos=16",
        "sft_warmup.batch_size=8",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=2",
    ]
    cfg = load_config(name, None, overrides, AgenticConfig)
    if not cfg.sft_warmup.enabled:  # shorter episodes; demonstrations need the full action budget
        for spec in cfg.custom_envs.values():
            spec.max_actions_per_traj = min(spec.max_actions_per_traj, 2)
    metrics = AgenticPipeline(cfg).run()
    for key in ("rollout/success_rate", "rollout/mean_reward", "actor/pg_loss", "time/step"):
        assert math.isfinite(metrics[key]), key
    assert (tmp_path / "out" / "final" / "config.json").is_file()
