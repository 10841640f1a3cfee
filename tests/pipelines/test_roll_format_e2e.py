"""ROLL v0.3-layout configs (tests/config/roll_format/, written for this suite) run through the real start script
on CPU for their 2 steps, with only the model path and hardware keys overridden (ROLL_CPU_OVERRIDES): the
defaults list pulls the shared env file, env blocks come by interpolation, ROLL's key names are translated, and
the keys without meaning in roll are named in one warning line. The GiGPO config pulls ROLL's step env file
(StepEnvManager, ROLL's step placeholders): one training sample per turn. agentic_sokoban runs on Ray, as ROLL's
would; the other two in one process (``distributed=local``: the same translation and pipeline, ~25 s less each
without Ray's start-up and actors)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "config" / "roll_format"
#: What a ROLL user changes for a CPU try-out (docs/migrating_from_roll.md): no GPUs, no device mappings, hf_infer
#: instead of vLLM (with vLLM's options removed).
ROLL_CPU_OVERRIDES = [
    "num_gpus_per_node=0",
    "~actor_train.device_mapping",
    "~actor_infer.device_mapping",
    "~reference.device_mapping",
    "actor_infer.strategy_args.strategy_name=hf_infer",
    "~actor_infer.strategy_args.strategy_config",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, tags, distributed",
    [
        ("agentic_sokoban", {"SimpleSokoban"}, "ray"),
        ("agentic_frozen_lake", {"FrozenLake"}, "local"),
        ("agentic_sokoban_gigpo", {"SimpleSokoban"}, "local"),
    ],
)
def test_roll_format_config_runs_two_steps_on_cpu(tmp_path, tiny_model_dir, name, tags, distributed):
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-path",
        str(CONFIGS),
        "--config-name",
        name,
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        *ROLL_CPU_OVERRIDES,
        f"distributed={distributed}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "ROLL keys without meaning in roll" in line]
    assert len(warnings) == 1 and f"custom_envs.{sorted(tags)[0]}.use_thread_lock" in warnings[0]
    rows = [json.loads(line) for line in (tmp_path / "output" / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(key in row for row in steps for key in ("actor/pg_loss", "actor/grad_norm"))
    if name == "agentic_sokoban_gigpo":  # ROLL's StepEnvManager: every turn a new prompt and a sample of its own
        assert all(r["rollout/template_breaks"] > 0 and r["perf/samples"] > r["rollout/batch_size"] for r in steps)
    else:
        assert all(r["rollout/template_breaks"] == 0 and r["perf/samples"] == r["rollout/batch_size"] for r in steps)
    assert (tmp_path / "output" / "final" / "config.json").is_file()
