"""End to end on Ray: sokoban_tiny with ``fsdp2_train`` for the actor and ``fsdp2_infer`` for a KL reference,
through the real start script: steps train, checkpoints hold the DCP shards, the exported actor loads with
transformers and moved away from the start."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skeleton.test_e2e_agentic import small_run_overrides

REPO = Path(__file__).resolve().parents[2]
#: sokoban_tiny plus a KL reference on fsdp2_infer (the actor is switched to fsdp2_train on the command line).
REFERENCE = """
use_kl_loss: true
kl_loss_coef: 0.01
reference:
  strategy_args:
    strategy_name: fsdp2_infer
    strategy_config: {reshard_after_forward: true}
  num_cpus_per_worker: 1
  infer_batch_size: 16
"""


@pytest.mark.slow
def test_two_steps_with_fsdp2_actor_and_reference(tmp_path, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "sokoban_fsdp2.yaml").write_text(
        (REPO / "examples" / "config" / "sokoban_tiny.yaml").read_text() + REFERENCE
    )
    overrides = [o.replace("max_steps=3", "max_steps=2") for o in small_run_overrides(tmp_path, tiny_model_dir)]
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-path",
        str(configs),
        "--config-name",
        "sokoban_fsdp2",
        *overrides,
        "actor_train.strategy_args.strategy_name=fsdp2_train",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "roll: config warning: actor_train.strategy_args.strategy_config.zero_stage is ignored" in proc.stderr

    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "time/ref_log_probs", "time/sync"):
            assert key in row and math.isfinite(row[key]), key
    step1 = tmp_path / "out" / "checkpoints" / "step_1"
    assert (step1 / "actor_train" / ".metadata").is_file() and (step1 / "actor_train" / "roll_state.json").is_file()
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final")
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert max((a - b).abs().max().item() for a, b in zip(final.parameters(), start.parameters())) > 0
    assert torch.isfinite(final(torch.tensor([[1, 2, 3]])).logits).all()
