"""ROLL v0.3-layout configs (tests/config/roll_format/, written for this suite) run through the real start script
on CPU for their 2 steps, with only the model path and hardware keys overridden (ROLL_CPU_OVERRIDES): the
defaults list pulls the shared env file, env blocks come by interpolation, ROLL's key names are translated, and
the keys without meaning in roll are named in one warning line. The GiGPO config pulls ROLL's step env file
(StepEnvManager, ROLL's step placeholders): one training sample per turn. agentic_sokoban runs on Ray, as ROLL's
would; the other two in one process (``distributed=local``: the same translation and pipeline, ~25 s less each
without Ray's start-up and actors). The VL config (ROLL's VLTrajEnvManager layout) runs one step with the tiny
Qwen2.5-VL model: its frames reach the prompts where ROLL's templates put them."""

from __future__ import annotations

import json
import re
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


def _start(tmp_path: Path, name: str, model_dir: str, *overrides: str) -> subprocess.CompletedProcess:
    """ROLL-layout config ``name`` through the start script from ``tmp_path``, with ``model_dir`` as its models,
    :data:`ROLL_CPU_OVERRIDES` and ``overrides``; asserts exit code 0."""
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-path",
        str(CONFIGS),
        "--config-name",
        name,
        f"pretrain={model_dir}",
        f"reward_pretrain={model_dir}",
        *ROLL_CPU_OVERRIDES,
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


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
    proc = _start(tmp_path, name, tiny_model_dir, f"distributed={distributed}")
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


#: What a ROLL user changes for ROLL's VL example on a CPU besides ROLL_CPU_OVERRIDES: Megatron's actor as FSDP2
#: (roll refuses Megatron for a vision-language model) and sizes for a CPU (one step of 8 episodes of at most 3
#: turns; validation on one room of each of the four validation tags). Trajectory dumps record the frames.
VL_CPU_OVERRIDES = [
    "actor_train.strategy_args.strategy_name=fsdp2_train",
    "~actor_train.strategy_args.strategy_config",
    "max_steps=1",
    "rollout_batch_size=8",
    "val_batch_size=4",
    "sequence_length=1024",
    "max_actions_per_traj=3",
    "max_tokens_per_step=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "train_env_manager.num_groups_partition=[2]",
    "val_env_manager.num_env_groups=4",
    "val_env_manager.num_groups_partition=[1,1,1,1]",
    "actor_train.training_args.gradient_accumulation_steps=4",
    "trajectory_dump_steps=1",
]
#: The tiny model's stand-in for an instruct model: untrained, it never writes a move, so every episode scores the
#: same and GRPO's advantages are all 0. A 16-step warm start on solver plans, shown with the same ROLL prompts and
#: frames, makes it answer in format, and the RL step has a signal.
VL_WARM_START = ["sft_warmup.enabled=true", "sft_warmup.steps=16", "sft_warmup.num_demos=32", "sft_warmup.batch_size=8"]


@pytest.mark.slow
def test_roll_format_vl_config_trains_on_frames_on_cpu(tmp_path, tiny_vl_model_dir):
    """ROLL's VL layout (VLTrajEnvManager, pre_step_template + frame + next_step_template, reward_template,
    render_mode: rgb_array) with the tiny Qwen2.5-VL model: every turn's prompt holds its frame as image tokens
    between the two templates' text, the dumps keep the frames, and the RL step had a learning signal."""
    # one process (distributed=local): the VL path under Ray is test_sokoban_vl_tiny's
    proc = _start(
        tmp_path, "agentic_vl_sokoban", tiny_vl_model_dir, *VL_CPU_OVERRIDES, *VL_WARM_START, "distributed=local"
    )
    warnings = [line for line in proc.stderr.splitlines() if "ROLL keys without meaning in roll" in line]
    assert len(warnings) == 1
    assert all(f"custom_envs.FrozenLake.{k}" in warnings[0] for k in ("env_manager_cls", "user_prompt_format"))
    logs = tmp_path / "output" / "logs"
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if r["step"] == 1 and "actor/pg_loss" in r]
    assert step["perf/samples"] == 8 and step["actor/grad_norm"] > 0
    records = [
        json.loads(line) for line in (logs / "trajectories" / "train" / "step_00001.jsonl").read_text().splitlines()
    ]
    assert len(records) == 8 and any(a != 0 for r in records for turn in r["turns"] for a in turn["adv"])
    # a turn's message: pre_step_template, the frame's image tokens, next_step_template (as ROLL's manager writes it)
    framed = re.compile(
        r"Move (\d+)\. The board:\n<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>\d+ moves left"
    )
    for record in records:
        assert record["frame_counts"]["seen"] == record["frame_counts"]["kept"] == len(record["turns"]) > 0
        for k, turn in enumerate(record["turns"]):
            assert turn["frames"] and framed.findall(turn["prompt"]) == [str(k + 1)], turn["prompt"]
            assert k == 0 or turn["prompt"].count("Last reward: ") == 1  # reward_template before later turns
    frames = list((logs / "trajectories" / "train").glob("step_00001_frames/*/*.png"))
    assert len(frames) == sum(r["frame_counts"]["kept"] for r in records)
    val = [json.loads(line) for line in (logs / "trajectories" / "val" / "step_00001.jsonl").read_text().splitlines()]
    assert {r["tag"] for r in val} == {"SimpleSokoban", "LargerSokoban", "SokobanLetters", "FrozenLake"}
    assert all(turn["frames"] for r in val for turn in r["turns"])
