"""The start script turns each kind of bad config into one stderr line naming the key, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "start_agentic_pipeline.py"


@pytest.mark.parametrize(
    "override, start, words",
    [
        ("rollout_bach_size=8", "roll: config error: rollout_bach_size", ["did you mean", "rollout_batch_size"]),
        ("max_steps=ten", "roll: config error: max_steps", []),
        (
            "reward_normalization.grouping=episode",
            "roll: config error: reward_normalization.grouping='episode'",
            ["state", "batch", "inductive"],
        ),
        (
            "actor_train.training_args.gradient_accumulation_steps=3",
            "roll: config error: actor_train.training_args.gradient_accumulation_steps=3",
            ["x world_size (1)", "must divide the 32 samples", "= 32 / (8 x 1) = 4"],
        ),
        # strategy_config={}: the example's DeepSpeed options are no MegatronOptions (that error would come first)
        (
            "actor_train.strategy_args.strategy_name=megatron_train actor_train.strategy_args.strategy_config={}",
            "roll: config error: actor_train.strategy_args.strategy_name='megatron_train'",
            ["megatron"],
        ),
    ],
)
def test_roll_style_config_error_is_one_line_exit_2(tmp_path, override, start, words):
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--config-path",
            "roll_style",
            "--config-name",
            "agentic_sokoban",
            *override.split(),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(start), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]
