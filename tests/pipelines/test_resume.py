"""Exact resume: N steps straight == N/2 steps, an interruption, then a resume for N/2 (CPU, local mode).

Also: a checkpoint holds everything listed in ``roll.pipelines.checkpoint`` (the run-health state included), an
interrupted save (no ``COMPLETE``) is never picked, and ``resume_from_checkpoint`` accepts a path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roll.config.agentic import AgenticConfig
from roll.config.loader import load_config
from roll.pipelines import checkpoint as ckpt
from roll.pipelines.agentic_pipeline import AgenticPipeline
from roll.tracking.health import HEALTH_FILE, read_events

STEPS = 4


def _config(tiny_model_dir: str, out: Path, *extra: str, name: str = "sokoban_tiny") -> AgenticConfig:
    overrides = [
        f"pretrain={tiny_model_dir}",
        "tiny_model=null",
        f"output_dir={out}",
        f"logging_dir={out}/logs",
        "distributed=local",
        "track_with=stdout",
        f"max_steps={STEPS}",
        "save_steps=2",
        "eval_steps=0",
        "trajectory_dump_steps=0",
        "sft_warmup.enabled=false",
        "rollout_batch_size=8",
        "sequence_length=256",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=4",
        "val_env_manager=null",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "actor_train.training_args.learning_rate=1e-3",
        "actor_train.num_cpus_per_worker=1",
        "actor_infer.num_cpus_per_worker=1",
        "custom_envs.SimpleSokoban.max_actions_per_traj=3",
        "actor_infer.generating_args.max_new_tokens=6",
        "custom_envs.SimpleSokoban.max_tokens_per_step=6",
        # identity normalization: an untrained model's equal scores still give non-zero advantages, so every
        # step changes the weights (mean_std would zero them and make the comparison vacuous)
        "reward_normalization.grouping=batch",
        "reward_normalization.method=identity",
        "entropy_loss_coef=0.01",
        # every gradient is above this bound: the health rule's streak (steps 1-2 before the checkpoint) fires at
        # step 3 only if the resume restores it (without its state it would fire at step 5)
        "run_health.grad_norm_max=1e-9",
        *extra,
    ]
    return load_config(name, overrides=overrides)


class _Interrupted(Exception):
    """Stands in for a kill right after step 2's checkpoint."""


def _metrics_by_step(out: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines() if line]
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(path).named_parameters())


def _straight_and_resumed(tiny_model_dir: str, tmp_path: Path, monkeypatch, *extra: str, name: str = "sokoban_tiny"):
    """Run the config straight, and again killed after step 2's checkpoint and resumed; returns both output dirs
    after checking that their steps after the checkpoint logged the same metrics."""
    straight = tmp_path / "straight"
    AgenticPipeline(_config(tiny_model_dir, straight, *extra, name=name)).run()

    resumed = tmp_path / "resumed"
    pipe = AgenticPipeline(_config(tiny_model_dir, resumed, *extra, name=name))
    real_step = AgenticPipeline.train_step

    def step_then_die(self, step):
        if step == STEPS // 2 + 1:
            raise _Interrupted()
        return real_step(self, step)

    monkeypatch.setattr(AgenticPipeline, "train_step", step_then_die)
    with pytest.raises(_Interrupted):
        pipe.run()
    monkeypatch.setattr(AgenticPipeline, "train_step", real_step)
    # an interrupted later save must be ignored: fake one with a higher step and no COMPLETE marker
    (ckpt.checkpoints_root(resumed) / "step_3").mkdir()
    (ckpt.checkpoints_root(resumed) / ".tmp-step_4").mkdir()
    assert ckpt.resolve_resume(True, resumed).name == "step_2"
    AgenticPipeline(_config(tiny_model_dir, resumed, *extra, "resume_from_checkpoint=true", name=name)).run()

    a, b = _metrics_by_step(straight), _metrics_by_step(resumed)
    assert [a[s]["health/grad_norm"] for s in range(1, STEPS + 1)] == [0.0, 0.0, 1.0, 1.0]
    events = [read_events(out / "logs" / HEALTH_FILE) for out in (straight, resumed)]
    assert [(e["step"], e["rule"]) for e in events[0] if e["rule"] == "grad_norm"] == [(3, "grad_norm")]
    assert [(e["step"], e["rule"], e["event"]) for e in events[1]] == [
        (e["step"], e["rule"], e["event"]) for e in events[0]
    ]
    for step in range(STEPS // 2 + 1, STEPS + 1):
        keys = [
            k
            for k in a[step]
            if not k.startswith(("time/", "perf/train_tokens_per_s")) and k != "step" and isinstance(a[step][k], float)
        ]
        assert "rollout/mean_reward" in keys, keys
        assert a[step]["actor/pg_loss"] != 0.0
        for k in keys:
            assert b[step][k] == pytest.approx(a[step][k], rel=1e-5, abs=1e-6), (step, k)
    return straight, resumed


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["deepspeed_train", "fsdp2_train"])
def test_resume_matches_straight_run(tiny_model_dir, tmp_path, monkeypatch, strategy):
    train = f"actor_train.strategy_args.strategy_name={strategy}"
    straight, resumed = _straight_and_resumed(tiny_model_dir, tmp_path, monkeypatch, train)
    wa, wb = _weights(straight / "final"), _weights(resumed / "final")
    mid = _weights(straight / "checkpoints" / "step_2" / "actor_hf")
    assert max(float((wa[n] - mid[n]).abs().max()) for n in wa) > 1e-4  # steps 3-4 trained
    for name, tensor in wa.items():
        torch.testing.assert_close(wb[name], tensor, rtol=0, atol=1e-6)
    # both runs' step-2 checkpoints are complete and hold every part
    for out in (straight, resumed):
        step2 = ckpt.checkpoints_root(out) / "step_2"
        assert ckpt.is_complete(step2)
        for part in ("actor_train", "actor_hf/config.json", "rng_actor_train.pt", "rng_actor_infer.pt", "pipeline.pt"):
            assert (step2 / part).exists(), part
        state = ckpt.read_state(step2)
        assert state["step"] == 2 and state["tracker_run_id"] and "kl_ctl" in state


def _adapter(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "adapter_model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["deepspeed_train", "fsdp2_train"])
def test_lora_resume_matches_straight_run(tiny_model_dir, tmp_path, monkeypatch, strategy):
    """The same with LoRA (sokoban_tiny_lora, a KL loss to the base model): the checkpoint's actor is a peft
    adapter directory, and the resumed run's metrics and final adapter equal the straight run's."""
    extra = (f"actor_train.strategy_args.strategy_name={strategy}", "use_kl_loss=true", "kl_loss_coef=0.01")
    straight, resumed = _straight_and_resumed(tiny_model_dir, tmp_path, monkeypatch, *extra, name="sokoban_tiny_lora")
    wa, wb = _adapter(straight / "final"), _adapter(resumed / "final")
    mid = _adapter(straight / "checkpoints" / "step_2" / "actor_hf")
    assert max(float((wa[n] - mid[n]).abs().max()) for n in wa) > 1e-4  # steps 3-4 trained the adapter
    for name, tensor in wa.items():
        torch.testing.assert_close(wb[name], tensor, rtol=0, atol=1e-6)
    step2 = ckpt.checkpoints_root(straight) / "step_2"
    assert (step2 / "actor_hf" / "adapter_config.json").is_file()
    assert not list((step2 / "actor_hf").glob("model*.safetensors"))  # the adapter, not a copy of the base


def test_resolve_resume_rules(tmp_path):
    root = ckpt.checkpoints_root(tmp_path)
    assert ckpt.resolve_resume(True, tmp_path) is None  # nothing yet: start fresh
    for step, complete in ((2, True), (4, True), (6, False)):
        (root / f"step_{step}").mkdir(parents=True)
        if complete:
            (root / f"step_{step}" / ckpt.COMPLETE).write_text("{}")
    (root / ".tmp-step_8").mkdir()
    assert ckpt.resolve_resume(True, tmp_path) == root / "step_4"
    assert ckpt.resolve_resume(False, tmp_path) is None
    assert ckpt.resolve_resume(str(root / "step_2"), tmp_path) == root / "step_2"
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        ckpt.resolve_resume(str(root / "step_6"), tmp_path)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 4]
