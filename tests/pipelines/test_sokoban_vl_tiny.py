"""End to end on Ray: ``sokoban_vl_tiny`` (a tiny Qwen2.5-VL model built from the config, frame-only prompts) warm
starts on solver plans shown as frames and trains two RL steps through the real start script. The learning signal:
the warm start takes the untrained model (random tokens, every action invalid) to well-formed moves (its loss falls
tenfold, validation's invalid-action rate is low), and the trainer's log-probs of the image rollouts equal the
engine's. Whether the moves come from the frames is measured with :func:`demo_action_nll` (docs/verified.md): a
short warm start does not get there, so this test does not assert it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def demo_action_nll(model_dir: str, env_config: dict, shuffle: bool, demos: int = 48, seed: int = 7) -> float:
    """Mean NLL of the solver's move tokens (``Up``/``Down``/...) in ``demos`` warm-start demonstrations of
    ``model_dir``, with each sample's own frames, or (``shuffle``) with the frames of the next sample (another room;
    the token ids are unchanged, every frame has the same size)."""
    from roll.config.agentic import CustomEnvConfig
    from roll.data.layout import loss_mask
    from roll.models.loading import load_causal_lm, load_tokenizer
    from roll.models.logprobs import token_log_probs
    from roll.models.vision import vision_kwargs
    from roll.pipelines.sft_warmup import make_demo_batches

    tokenizer = load_tokenizer(model_dir)
    spec = CustomEnvConfig(
        env_type="sokoban",
        env_config=env_config,
        max_actions_per_traj=10,
        max_tokens_per_step=12,
        system_prompt="You are a Sokoban player.",
        first_turn_template="Move.",
        turn_template="Move.",
    )
    (batch,) = make_demo_batches(spec, env_config, tokenizer, "S", demos, demos, 1, seed, model_dir)
    if shuffle:
        batch["pixel_values"] = batch["pixel_values"][1:] + batch["pixel_values"][:1]
        batch["image_grid_thw"] = batch["image_grid_thw"][1:] + batch["image_grid_thw"][:1]
    moves = {tokenizer.convert_tokens_to_ids(w) for w in ("Up", "Down", "Left", "Right")}
    model = load_causal_lm(model_dir).eval()
    with torch.no_grad():
        lp, _ = token_log_probs(model, batch["input_ids"], batch["attention_mask"], vision=vision_kwargs(batch, "cpu"))
    targets = batch["input_ids"][:, 1:]
    is_move = loss_mask(batch["response_mask"]).bool() & torch.isin(targets, torch.tensor(sorted(moves)))
    return float(-lp[is_move].mean())


@pytest.mark.slow
def test_warm_start_reads_frames_and_rl_steps_train(tmp_path):
    overrides = [
        f"pretrain={tmp_path}/model",  # built from the config's tiny_model (vision: true)
        f"output_dir={tmp_path}/out",
        f"logging_dir={tmp_path}/logs",
        "max_steps=2",
        "max_train_minutes=60",
        "save_steps=0",
        "eval_steps=2",
        "trajectory_dump_steps=0",
        "sft_warmup.steps=16",  # the loss is ~20x down by step 12 (7.7 -> 0.37), ~0.7% invalid actions after 16
        "sft_warmup.num_demos=256",  # one pass of 16 batches of 16
        "rollout_batch_size=16",
        "train_env_manager.env_groups=2",
        "val_env_manager.env_groups=16",
        "actor_train.num_cpus_per_worker=1",
        "actor_infer.num_cpus_per_worker=1",
    ]
    cmd = [sys.executable, str(REPO / "examples" / "start_agentic_pipeline.py"), "--config-name", "sokoban_vl_tiny"]
    proc = subprocess.run(cmd + overrides, cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    warm = next(r for r in rows if "sft/final_loss" in r)
    assert warm["sft/final_loss"] < warm["sft/first_loss"] / 10
    steps = [r for r in rows if r["step"] >= 1 and "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        for key in ("actor/pg_loss", "actor/grad_norm", "rollout/success_rate"):
            assert math.isfinite(row[key]), key
        assert row["rollout/logprob_mismatch_max"] < 1e-4  # trainer (with images) = engine, per token
    val = [r for r in rows if "val/invalid_action_rate" in r]
    assert val and val[0]["step"] == 0  # validation after the warm start, before RL
    assert val[0]["val/invalid_action_rate"] < 0.1  # the untrained model's random tokens are ~all invalid
    assert (tmp_path / "out" / "final" / "preprocessor_config.json").is_file()  # the export serves images
