"""The start script's command line: both spellings, overrides, and one-line config errors with exit code 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.loader import load_config
from roll.launch.command import load_checked, parse_args

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "start_agentic_pipeline.py"


def test_both_spellings_and_overrides_parse():
    a = parse_args(["--config_name", "x", "--config_path", "p", "max_steps=3"], "d")
    b = parse_args(["--config-name", "x", "--config-path", "p", "max_steps=3"], "d")
    assert (
        (a.config_name, a.config_path, a.overrides)
        == (b.config_name, b.config_path, b.overrides)
        == ("x", "p", ["max_steps=3"])
    )


def test_overrides_reach_typed_config():
    cfg = load_config(
        "sokoban_tiny",
        None,
        ["max_steps=3", "actor_train.strategy_args.strategy_config.zero_stage=3", "exp_name=abc"],
        AgenticConfig,
    )
    assert isinstance(cfg, AgenticConfig)
    assert cfg.max_steps == 3 and cfg.exp_name == "abc"
    assert cfg.actor_train.strategy_args.strategy_config["zero_stage"] == 3


def test_config_path_relative_to_examples():
    cfg = load_config("sokoban_tiny", "config", [], AgenticConfig)
    assert cfg.train_env_manager.group_size == 8


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("max_stepz=3", "max_stepz", ["max_steps"]),
        ("max_steps=abc", "max_steps", []),
        ("rollout_batch_size=60", "rollout_batch_size", ["multiple of", "group_size"]),
        ("reward_normalization.method=zscore", "reward_normalization.method", ["mean_std", "asym_clip"]),
        ("actor_train.strategy_args.strategy_name=foo", "actor_train.strategy_args.strategy_name", ["deepspeed_train"]),
        (
            "actor_infer.strategy_args.strategy_name=deepspeed_train",
            "actor_infer.strategy_args.strategy_name",
            ["cannot serve", "hf_infer"],
        ),
        ("train_env_manager.tags=[Nope]", "train_env_manager.tags", ["SimpleSokoban"]),
        ("actor_train.training_args.gradient_accumulation_steps=3", "gradient_accumulation_steps", ["must divide"]),
    ],
)
def test_bad_values_name_the_key(override, key, words):
    with pytest.raises(ConfigError) as err:
        load_checked("sokoban_tiny", None, [override], AgenticConfig)
    message = str(err.value)
    assert key in message and "\n" not in message
    for word in words:
        assert word in message


def test_start_script_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--config-name", "sokoban_tiny", "rollout_batch_size=60"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("roll: config error: rollout_batch_size=60")
    assert "Traceback" not in proc.stderr
