"""``old_log_probs_source: engine``: the PPO ratio's old log-probs are the inference engine's sampling log-probs,
with no trainer pass. On CPU, hf_infer and the trainer compute the same fp32 numbers (to ~1e-7), so a run with the
engine's log-probs must train exactly as one with the trainer's, minus the pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roll.config.loader import load_config
from roll.config.validation import ConfigError, engine_old_log_probs, unused_settings
from roll.data.batch import Batch
from roll.ppo.epochs import old_log_probs_of_engine
from tests.tiny_runs import TINY_LOCAL_RUN

#: a tiny Sokoban run in one process; 8 episodes a rollout in mini-batches of 2: four optimizer steps, so the
#: trainer source runs its separate pass (not the skipped one) and the later mini-batches' ratios move off 1
OVERRIDES = [
    *TINY_LOCAL_RUN,
    "max_steps=2",
    "max_train_minutes=0",
    "eval_steps=0",
    "val_env_manager=null",
    "trajectory_dump_steps=0",
    "sft_warmup.steps=3",
    "sft_warmup.batch_size=4",
    "sft_warmup.num_demos=12",
    "rollout_batch_size=8",
    "train_env_manager.env_groups=2",
    "train_env_manager.group_size=4",
    "sequence_length=256",
    "custom_envs.SimpleSokoban.max_actions_per_traj=3",
    "actor_train.training_args.per_device_train_batch_size=2",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "actor_train.training_args.warmup_steps=0",
]


def _batch(trained: list[list[int]], engine: list[list[float]], has: list[list[int]]) -> Batch:
    """A batch whose log-prob frame has ``trained`` tokens (response mask shifted by one), the engine's values
    ``engine`` where ``has`` is 1."""
    response = torch.tensor([[0, *row] for row in trained])
    return Batch(
        tensors={
            "response_mask": response,
            "rollout_log_probs": torch.tensor(engine),
            "rollout_log_prob_mask": torch.tensor(has, dtype=torch.float32),
        }
    )


def test_engine_log_probs_are_the_old_log_probs_where_trained():
    batch = _batch([[0, 1, 1], [1, 0, 0]], [[9.0, -0.5, -1.25], [-2.0, 7.0, 7.0]], [[0, 1, 1], [1, 0, 0]])
    old = old_log_probs_of_engine(batch)
    # the trained tokens keep the engine's values; the rest is 0 (never read: the loss mask is 0 there)
    assert old.tolist() == [[0.0, -0.5, -1.25], [-2.0, 0.0, 0.0]]


def test_a_trained_token_without_an_engine_log_prob_is_refused():
    batch = _batch([[0, 1, 1], [1, 0, 0]], [[0.0, -0.5, 0.0], [-2.0, 0.0, 0.0]], [[0, 1, 0], [1, 0, 0]])
    with pytest.raises(ValueError, match="1 of 3 trained tokens have no engine log-prob"):
        old_log_probs_of_engine(batch)
    with pytest.raises(ValueError, match="no engine log-probs"):
        old_log_probs_of_engine(Batch(tensors={"response_mask": torch.ones(1, 3, dtype=torch.long)}))


@pytest.mark.parametrize(
    "config,other",
    [
        ("algo_ppo", "add_token_level_kl=true"),  # algo_ppo has the reference worker a KL penalty needs
        ("sokoban_tiny", "enable_old_logprobs_recompute=true"),
        ("sokoban_tiny", "async_generation_ratio=1"),
        ("sokoban_tiny", "train_infer_correction.is_weight.enabled=true"),
    ],
)
def test_the_trainers_pass_runs_where_a_setting_needs_it_and_a_warning_says_so(config, other):
    """sokoban_tiny sets engine; a KL penalty in the reward, the correction, recompute or async need the trainer's
    old log-probs, so the engine's are not used, and the launch warns naming the key (nothing silently ignored)."""
    assert engine_old_log_probs(load_config("sokoban_tiny"))
    cfg = load_config(config, overrides=[other, "old_log_probs_source=engine"])
    assert not engine_old_log_probs(cfg)
    key = other.split("=")[0].split(".")[0]
    assert [w for w in unused_settings(cfg) if w.startswith("old_log_probs_source='engine'") and key in w]
    quiet = load_config(config, overrides=[other, "old_log_probs_source=trainer"])
    assert not [w for w in unused_settings(quiet) if "old_log_probs_source" in w]


def test_an_unknown_source_names_the_allowed_values():
    with pytest.raises(ConfigError, match="old_log_probs_source") as err:
        load_config("sokoban_tiny", overrides=["old_log_probs_source=reference"])
    assert "trainer" in str(err.value) and "engine" in str(err.value)


def _run(model_dir: str, out: Path, source: str) -> list[dict]:
    from roll.pipelines.agentic_pipeline import AgenticPipeline

    overrides = [
        *OVERRIDES,
        f"pretrain={model_dir}",
        f"output_dir={out}",
        f"logging_dir={out}/logs",
        f"old_log_probs_source={source}",
    ]
    AgenticPipeline(load_config("sokoban_tiny", overrides=overrides)).run()
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/step" in r]


@pytest.mark.slow
def test_a_run_on_the_engines_log_probs_trains_as_one_on_the_trainers(tmp_path):
    model = str(tmp_path / "model")  # built by the first run, loaded by the second
    trainer = _run(model, tmp_path / "trainer", "trainer")
    engine = _run(model, tmp_path / "engine", "engine")
    assert [r["step"] for r in engine] == [1, 2]
    for t, e in zip(trainer, engine):
        assert "time/old_log_probs" in t and "time/old_log_probs" not in e  # the pass is gone
        assert "rollout/logprob_mismatch" in t and "rollout/logprob_mismatch" not in e
        assert t["rollout/logprob_mismatch"] < 1e-5  # the premise: engine and trainer agree in fp32 on CPU
        assert e["actor/grad_norm"] > 0 and e["actor/approx_kl"] > 0  # it trained, and the ratio left 1
        for key in ("actor/pg_loss", "actor/clip_frac", "actor/approx_kl", "actor/grad_norm", "actor/entropy"):
            assert e[key] == pytest.approx(t[key], rel=1e-3, abs=1e-7), key
