"""The DeepSpeed fragments of examples/config train on CPU through deepspeed_train, with "auto" values filled in."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from roll.config.strategies import DeepSpeedTrainOptions, parse_options
from roll.strategies.deepspeed_train import build_ds_config

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parents[1] / "examples" / "config"
FRAGMENTS = {"deepspeed_zero": 0, "deepspeed_zero2": 2, "deepspeed_zero3": 3, "deepspeed_zero3_cpuoffload": 3}


def block(name: str) -> dict:
    tree = OmegaConf.to_container(OmegaConf.load(CONFIG / f"{name}.yaml"))
    assert list(tree) == [name], "a fragment holds exactly one block named like its file"
    return tree[name]


@pytest.mark.parametrize("name, stage", FRAGMENTS.items())
def test_auto_values_resolved_from_worker_block(name, stage):
    options = parse_options(DeepSpeedTrainOptions, block(name), f"{name}.strategy_config")
    cfg = build_ds_config(options, micro_batch=4, grad_accum=8, world_size=2, max_grad_norm=0.5, dtype="bf16")
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["gradient_accumulation_steps"] == 8
    assert cfg["train_batch_size"] == 4 * 8 * 2 and cfg["gradient_clipping"] == 0.5
    assert cfg["bf16"] == {"enabled": True} and cfg["fp16"] == {"enabled": False}
    assert cfg["zero_optimization"]["stage"] == stage
    assert "auto" not in {v for v in cfg["zero_optimization"].values() if isinstance(v, str)}


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.slow
def test_every_fragment_trains_one_optimizer_step_on_cpu(tiny_model_dir):
    """4 samples, per_device_train_batch_size 2 x gradient_accumulation_steps 2 x world_size 1: one optimizer
    step, and AdamW's first step moves some weight by ~lr (1e-2)."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "ds_fragment_worker.py"), tiny_model_dir, _free_port(), ",".join(FRAGMENTS)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = {
        p[1]: (int(p[2]), float(p[3]))
        for p in (line.split() for line in proc.stdout.splitlines())
        if p and p[0] == "RESULT"
    }
    assert set(results) == set(FRAGMENTS), proc.stdout[-2000:] + proc.stderr[-3000:]
    for name, (steps, delta) in results.items():
        assert steps == 1, name
        assert 0.5e-2 < delta <= 1.01e-2, (name, delta)


@pytest.mark.parametrize("name", FRAGMENTS)
def test_fragment_is_not_a_pipeline_config(name):
    from roll.config.errors import ConfigError
    from roll.config.loader import is_fragment, load_config

    assert is_fragment(CONFIG / f"{name}.yaml")
    assert not is_fragment(CONFIG / "sokoban_tiny.yaml")
    with pytest.raises(ConfigError, match=f"{name}.yaml is a fragment for defaults lists"):
        load_config(name)
