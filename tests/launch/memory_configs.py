"""Config files for the memory planner's tests: Qwen2.5-0.5B- and 7B-shaped ``config.json`` files (no weights) and
an agentic GPU config around them, written by the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

#: Qwen2.5-0.5B's shape (tied embeddings) and Qwen2.5-7B's (untied), vocabulary 151,936 for both.
QWEN_05B = dict(
    model_type="qwen2",
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    tie_word_embeddings=True,
)
QWEN_7B = dict(
    model_type="qwen2",
    hidden_size=3584,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    intermediate_size=18944,
    vocab_size=151936,
    tie_word_embeddings=False,
)


def write_model(root: Path, name: str, hf: dict[str, Any]) -> str:
    """A model directory holding only ``config.json``: all the planner reads."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf))
    return str(path)


def worker(strategy: str, options: dict[str, Any], gpus: list[int], **extra: Any) -> dict[str, Any]:
    block = {
        "model_args": {"dtype": "bf16"},
        "strategy_args": {"strategy_name": strategy, "strategy_config": options},
        "device_mapping": gpus,
    }
    for key, value in extra.items():
        block.setdefault(key, {}).update(value) if isinstance(value, dict) else block.__setitem__(key, value)
    return block


def gpu_config(
    model: str,
    train: dict[str, Any] | None = None,
    infer: dict[str, Any] | None = None,
    reference: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """An agentic config on GPU 0: actor_train (deepspeed_train ZeRO-2, bf16, 2 x 2048-token micro-batches,
    checkpointing on) and actor_infer (hf_infer) colocated, GPUs of 79.2 GiB (an 80 GB H100)."""
    cfg = {
        "exp_name": "memory_test",
        "pretrain": model,
        "num_gpus_per_node": 8,
        "gpu_memory_gib": 79.2,
        "sequence_length": 2048,
        "rollout_batch_size": 64,
        "actor_train": train
        or worker(
            "deepspeed_train",
            {"zero_stage": 2},
            [0],
            training_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
        ),
        "actor_infer": infer or worker("hf_infer", {}, [0]),
        "custom_envs": {
            "SimpleSokoban": {
                "env_type": "sokoban",
                "env_config": {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 10},
                "max_actions_per_traj": 5,
                "max_tokens_per_step": 32,
            }
        },
        "train_env_manager": {"tags": ["SimpleSokoban"], "env_groups": 8, "group_size": 8},
        "val_env_manager": None,
        **top,
    }
    if reference is not None:
        cfg.update(reference=reference, use_kl_loss=True, kl_loss_coef=0.001)
    return cfg


def save(directory: Path, name: str, cfg: dict[str, Any]) -> tuple[str, str]:
    """Write ``cfg`` as ``<directory>/<name>.yaml``; returns ``(config_path, config_name)``."""
    directory.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(cfg), directory / f"{name}.yaml")
    return str(directory), name


def load(directory: Path, name: str, cfg: dict[str, Any]) -> Any:
    """``cfg`` written and loaded with roll's loader (validated, as a launch loads it)."""
    from roll.config.loader import load_config

    return load_config(name, *save(directory, name, cfg)[:1])
