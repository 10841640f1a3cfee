"""``async_generation_ratio: 1`` in the RLVR pipeline (CPU, local mode): each step trains on a batch generated
during the previous step by the weights one update older (the engine's log-probs then differ from the trainer's,
where the synchronous pipeline's agree), the run resumes exactly from a checkpoint (the already generated next
batch is part of it), and the setting is refused where it cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roll.config.errors import ConfigError
from roll.config.loader import load_config
from roll.config.rlvr import RLVRConfig
from roll.pipelines.rlvr_pipeline import RLVRPipeline

STEPS = 4


def _config(model_dir: str, out: Path, *extra: str) -> RLVRConfig:
    overrides = [
        f"pretrain={model_dir}", "tiny_model=null", f"output_dir={out}", f"logging_dir={out}/logs",
        "distributed=local", "track_with=stdout", f"max_steps={STEPS}", "save_steps=2", "eval_steps=0",
        "rollout_dump_steps=0", "sft_warmup.enabled=false", "rollout_batch_size=4", "num_return_sequences_in_group=4",
        "dynamic_sampling.enabled=false", "is_use_additional_prompts=false", "validation.file_name=[]",
        "rewards.num_workers=1", "actor_infer.generating_args.max_new_tokens=8",
        "actor_train.training_args.per_device_train_batch_size=16",
        "actor_train.training_args.gradient_accumulation_steps=1", "actor_train.training_args.learning_rate=1e-3",
        # the entropy term moves the weights every step even where all rewards are equal (zero advantages)
        "entropy_loss_coef=0.01", "actor_train.num_cpus_per_worker=1", "actor_infer.num_cpus_per_worker=1", *extra]
    return load_config("rlvr_tiny", overrides=overrides, schema=RLVRConfig)


def _rows(out: Path) -> dict[int, dict]:
    by_step: dict[int, dict] = {}
    for line in (out / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(path).named_parameters())


@pytest.mark.slow
def test_async_batches_are_one_update_old(tiny_model_dir, tmp_path):
    sync, lagged = tmp_path / "sync", tmp_path / "async"
    RLVRPipeline(_config(tiny_model_dir, sync, "save_steps=0")).run()
    RLVRPipeline(_config(tiny_model_dir, lagged, "save_steps=0", "async_generation_ratio=1")).run()
    a, b = _rows(sync), _rows(lagged)
    assert [b[s]["rollout/policy_lag"] for s in range(1, STEPS + 1)] == [0.0, 1.0, 1.0, 1.0]
    assert all(a[s]["rollout/policy_lag"] == 0.0 for s in range(1, STEPS + 1))
    # synchronous: the engine sampled with the trainer's weights (fp32: equal log-probs up to kernels)
    assert all(a[s]["rollout/logprob_mismatch_max"] < 1e-4 for s in range(1, STEPS + 1))
    # async: step 1's batch came from the start weights too; later batches from the weights one update older
    assert b[1]["rollout/logprob_mismatch_max"] < 1e-4
    assert all(b[s]["rollout/logprob_mismatch"] > 1e-3 for s in range(2, STEPS + 1)), b
    assert b[1]["actor/pg_loss"] == pytest.approx(a[1]["actor/pg_loss"], rel=1e-5)  # same first batch


@pytest.mark.slow
def test_async_resume_matches_straight_run(tiny_model_dir, tmp_path, monkeypatch):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    RLVRPipeline(_config(tiny_model_dir, straight, "async_generation_ratio=1")).run()

    class Interrupted(Exception):
        pass

    real_step = RLVRPipeline.train_step

    def step_then_die(self, step):
        if step == STEPS // 2 + 1:
            raise Interrupted()
        return real_step(self, step)

    pipe = RLVRPipeline(_config(tiny_model_dir, resumed, "async_generation_ratio=1"))
    monkeypatch.setattr(RLVRPipeline, "train_step", step_then_die)
    with pytest.raises(Interrupted):
        pipe.run()
    pipe.finish()
    monkeypatch.setattr(RLVRPipeline, "train_step", real_step)
    RLVRPipeline(_config(tiny_model_dir, resumed, "async_generation_ratio=1", "resume_from_checkpoint=true")).run()

    a, b = _rows(straight), _rows(resumed)
    for step in range(STEPS // 2 + 1, STEPS + 1):
        keys = [k for k in a[step] if not k.startswith(("time/", "perf/")) and isinstance(a[step][k], float)]
        assert "rollout/mean_reward" in keys and "rollout/logprob_mismatch" in keys
        for k in keys:
            assert b[step][k] == pytest.approx(a[step][k], rel=1e-5, abs=1e-6), (step, k)
    wa, wb = _weights(straight / "final"), _weights(resumed / "final")
    for name, tensor in wa.items():
        torch.testing.assert_close(wb[name], tensor, rtol=0, atol=1e-6)


def test_async_generation_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match=r"async_generation_ratio=0.5: .*must be one of"):
        load_config("rlvr_tiny", overrides=["async_generation_ratio=0.5"], schema=RLVRConfig)
    with pytest.raises(ConfigError, match=r"async_generation_ratio=1.0: generating while training needs actor_infer "
                                          r"on GPUs of its own; GPUs \[0\] are shared"):
        load_config("rlvr_qwen05b_gpu", overrides=["async_generation_ratio=1"], schema=RLVRConfig)
    with pytest.raises(ConfigError, match=r"async_generation_ratio=1.0: the agentic pipeline is synchronous"):
        load_config("sokoban_tiny", overrides=["async_generation_ratio=1"])


def test_oversubscribed_cpu_roles_are_warned_about():
    from roll.pipelines.preflight import check_async_threads

    cfg = load_config("rlvr_tiny", overrides=["async_generation_ratio=1"], schema=RLVRConfig)
    (line,) = check_async_threads(cfg, cores=2)  # 2 + 2 threads on 2 cores
    assert line.startswith("async_generation_ratio=1: actor_train and actor_infer generate and train at the same "
                           "time on CPU with 4 threads on 2 cores")
    cfg.actor_train.num_cpus_per_worker = cfg.actor_infer.num_cpus_per_worker = 1
    assert check_async_threads(cfg, cores=2) == []
    cfg.async_generation_ratio = 0.0
    cfg.actor_train.num_cpus_per_worker = 2
    assert check_async_threads(cfg, cores=2) == []
