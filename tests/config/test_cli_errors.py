"""The start script turns each kind of bad config into one stderr line naming the key, exit code 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.start_scripts import run_start_scripts

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "start_agentic_pipeline.py"

# (overrides, the start of the one line, words it contains)
CASES = [
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
]


@pytest.fixture(scope="module")
def exits(tmp_path_factory):
    """Every case's exit code and stderr (one interpreter runs them all: tests/start_scripts.py)."""
    args = ["--config-path", "roll_style", "--config-name", "agentic_sokoban"]
    return run_start_scripts(
        [(SCRIPT, [*args, *override.split()]) for override, _, _ in CASES], tmp_path_factory.mktemp("cli")
    )


@pytest.mark.parametrize("case", range(len(CASES)), ids=[override for override, _, _ in CASES])
def test_roll_style_config_error_is_one_line_exit_2(exits, case):
    (_, start, words), proc = CASES[case], exits[case]
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(start), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]
