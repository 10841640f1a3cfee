"""A run whose user code makes it useless stops with one line, never "final actor saved" after training nothing:
a reward that returns NaN (named at its source), updates skipped for non-finite gradients (``max_skipped_updates``
in a row), and every early stop prints how to resume."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.config.loader import load_config
from roll.config.rlvr import RLVRConfig
from roll.errors import RunStopped
from roll.pipelines.base import resume_command
from roll.pipelines.rlvr_pipeline import RLVRPipeline

REPO = Path(__file__).resolve().parents[2]
NAN_FILE = REPO / "tests" / "debug" / "nan_reward.py"


def overrides(model_dir: str, out: Path, *extra: str) -> list[str]:
    """A tiny RLVR run in local mode, no warm start, no validation."""
    return [
        f"pretrain={model_dir}",
        "tiny_model=null",
        f"output_dir={out}",
        f"logging_dir={out}/logs",
        "distributed=local",
        "track_with=stdout",
        "save_steps=0",
        "rollout_dump_steps=0",
        "rollout_batch_size=2",
        "num_return_sequences_in_group=2",
        "dynamic_sampling.enabled=false",
        "is_use_additional_prompts=false",
        "rewards.num_workers=1",
        "actor_infer.generating_args.max_new_tokens=4",
        "sft_warmup.enabled=false",
        "eval_steps=0",
        "validation.file_name=[]",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "actor_train.num_cpus_per_worker=1",
        "actor_infer.num_cpus_per_worker=1",
        *extra,
    ]


@pytest.fixture(autouse=True, scope="module")
def unregister_debug_rewards():
    """The in-process runs import tests.debug.nan_reward (it registers two rewards): removed after this module."""
    yield
    from roll.rewards.registry import REWARDS, registered_rewards

    for name in ("debug_nan_reward", "debug_huge_reward"):
        if name in registered_rewards():
            REWARDS.unregister(name)
    sys.modules.pop("tests.debug.nan_reward", None)


def test_resume_command_replaces_an_earlier_resume_flag():
    assert (
        resume_command(
            [
                "examples/start_rlvr_pipeline.py",
                "--config-name",
                "rlvr_tiny",
                "max_steps=5",
                "resume_from_checkpoint=false",
            ]
        )
        == "python examples/start_rlvr_pipeline.py --config-name rlvr_tiny max_steps=5 resume_from_checkpoint=true"
    )


@pytest.mark.slow
def test_nan_reward_stops_the_run_with_one_line_naming_it(tiny_model_dir, tmp_path):
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_rlvr_pipeline.py"),
        "--config-name",
        "rlvr_tiny",
        *overrides(
            tiny_model_dir,
            tmp_path,
            "max_steps=3",
            "save_steps=1",
            "+rewards.tag_to_reward.math='tests.debug.nan_reward:debug_nan_reward'",
        ),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    line = next(i for i, text in enumerate(NAN_FILE.read_text().splitlines(), 1) if text.startswith("def nan_reward"))
    assert last.startswith(
        f"roll: run stopped: train step 1: reward function 'debug_nan_reward' (nan_reward defined "
        f"at {NAN_FILE}:{line}) returned score=nan for sample 0 (tag 'math', response "
    ), last
    assert "final actor saved" not in proc.stdout and "Traceback" not in proc.stderr
    assert "[roll] run stopped by RunStopped at step 1; no checkpoint yet (save_steps=1): start it again with: " in (
        proc.stdout
    )


@pytest.mark.slow
def test_skipped_updates_are_counted_and_stop_the_run(tiny_model_dir, tmp_path, capsys):
    """A finite but huge reward (3e38) overflows the gradients: each update is skipped; after 2 in a row the run
    stops, with the metric logged for both steps and the checkpoint of the step before named in the resume line."""
    cfg = load_config(
        "rlvr_tiny",
        overrides=overrides(
            tiny_model_dir,
            tmp_path,
            "max_steps=6",
            "max_skipped_updates=2",
            "adv_estimator=reinforce",
            "save_steps=1",
            "+rewards.tag_to_reward.math='tests.debug.nan_reward:debug_huge_reward'",
        ),
        schema=RLVRConfig,
    )
    with pytest.raises(RunStopped) as info:
        RLVRPipeline(cfg).run()
    assert str(info.value).startswith(
        "the actor's last 2 updates (steps 1-2) had a non-finite gradient norm (actor/grad_norm=inf)"
    ), str(info.value)
    assert "max_skipped_updates=2" in str(info.value)
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["actor/grad_norm"], r["actor/skipped_updates"]) for r in rows] == [
        (1, None, 1.0),
        (2, None, 1.0),
    ]
    out = capsys.readouterr().out
    assert "final actor saved" not in out and not (tmp_path / "final").exists()
    assert "[roll] run stopped by RunStopped at step 2; resume from the step-1 checkpoint with: python " in out
    assert out.strip().splitlines()[-1].endswith(" resume_from_checkpoint=true")


@pytest.mark.slow
def test_sigterm_prints_the_resume_command_and_the_resumed_run_finishes(tiny_model_dir, tmp_path):
    """A run killed with SIGTERM after its first checkpoint exits 130 with the command that resumes it, and that
    command (run as printed) continues from the checkpoint to the end."""
    script = REPO / "examples" / "start_rlvr_pipeline.py"
    cmd = [
        sys.executable,
        str(script),
        "--config-name",
        "rlvr_tiny",
        *overrides(tiny_model_dir, tmp_path, "max_steps=400", "save_steps=1", "zero_signal_patience=0"),
    ]
    # zero_signal_patience=0: the untrained tiny model scores 0 everywhere, and the run must still be going when killed
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob("checkpoints/step_*/COMPLETE")) and proc.poll() is None:  # (2 are kept)
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before a checkpoint"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("[roll] run stopped by SIGTERM at step "))
    assert "; resume from the step-" in line and line.endswith(" resume_from_checkpoint=true"), line
    command = shlex.split(line.split(" with: ", 1)[1])  # a shell command line, quoted where needed
    assert command[0] == "python" and command[1:-1] == cmd[1:]  # the launch's own arguments, then the flag
    step = int(line.split("resume from the step-")[1].split()[0])
    command = [c.replace("max_steps=400", f"max_steps={step + 2}") for c in command]  # two more steps suffice
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[roll] resumed from" in resumed.stdout and "final actor saved" in resumed.stdout


@pytest.mark.slow
def test_sigterm_during_the_warm_start_prints_the_stop_line(tiny_model_dir, tmp_path):
    """A kill during the supervised warm start, in Ray mode (whose ``ray.init`` installs a SIGTERM handler of its
    own): exit 130, no traceback, and the stop line names SIGTERM, the phase and the command that starts it again."""
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-name",
        "sokoban_tiny",
        f"pretrain={tiny_model_dir}",
        "tiny_model=null",
        f"output_dir={tmp_path}",
        f"logging_dir={tmp_path}/logs",
        "track_with=stdout",
        "save_steps=0",
        "eval_steps=0",
        "sft_warmup.steps=400",  # progress every 40 steps; the kill comes long before the end
        "sft_warmup.num_demos=64",
        "sft_warmup.batch_size=4",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "max_train_minutes=0",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.monotonic() + 600
    for line in proc.stdout:  # the warm start prints its progress every steps/10 steps: wait for its first line
        lines.append(line)
        if line.startswith("[sft warm start] step") or time.monotonic() > deadline:
            break
    assert proc.poll() is None, "".join(lines)[-3000:]
    proc.send_signal(signal.SIGTERM)
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("[roll] run stopped by SIGTERM during the warm start"))
    assert "no checkpoint yet (save_steps=0): start it again with: python " in line, line
    assert line.endswith(" resume_from_checkpoint=true"), line
