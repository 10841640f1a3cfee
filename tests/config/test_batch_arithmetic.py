"""Global train batch rules of the guide: DeepSpeed and Megatron formulas, and the one-step-per-rollout setting."""

from __future__ import annotations

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.validation import check_train_batch, model_parallel_size, optimizer_steps_per_rollout
from roll.config.worker import StrategyArgs, WorkerConfig


def config(pbs: int, ga: int, world: int, strategy: str = "deepspeed_train", **strategy_config) -> AgenticConfig:
    cfg = AgenticConfig()
    cfg.actor_train = WorkerConfig(strategy_args=StrategyArgs(strategy, dict(strategy_config)), world_size=world)
    cfg.actor_train.training_args.per_device_train_batch_size = pbs
    cfg.actor_train.training_args.gradient_accumulation_steps = ga
    return cfg


def test_deepspeed_global_batch_and_fix():
    # 2 x 3 x 2 = 12 does not divide 64; the fix: 64 / (2 x 2) = 16
    with pytest.raises(ConfigError) as err:
        check_train_batch(config(2, 3, 2), "actor_train", 64)
    message = str(err.value)
    assert message.startswith("actor_train.training_args.gradient_accumulation_steps=3")
    assert "per_device_train_batch_size (2) x gradient_accumulation_steps (3) x world_size (2) = 12" in message
    assert "gradient_accumulation_steps = 64 / (2 x 2) = 16" in message


def test_no_integer_fix_says_so():
    with pytest.raises(ConfigError, match="pick per_device_train_batch_size x world_size dividing 10"):
        check_train_batch(config(4, 1, 1), "actor_train", 10)


def test_megatron_divides_by_tp_pp_cp_not_ep():
    assert (
        model_parallel_size(
            "megatron_train",
            {
                "tensor_model_parallel_size": 2,
                "pipeline_model_parallel_size": 2,
                "context_parallel_size": 2,
                "expert_model_parallel_size": 4,
            },
        )
        == 8
    )
    assert model_parallel_size("deepspeed_train", {"tensor_model_parallel_size": 2}) == 1
    # world 16 / (TP 2 x PP 2) = 4 data-parallel ranks; 1 x 3 x 4 = 12 does not divide 64 -> 64 / (1 x 4) = 16
    cfg = config(1, 3, 16, "megatron_train", tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    with pytest.raises(ConfigError) as err:
        check_train_batch(cfg, "actor_train", 64)
    assert "world_size / (TP x PP x CP) (16 / 4) = 12" in str(err.value)
    assert "= 64 / (1 x 4) = 16" in str(err.value)
    with pytest.raises(ConfigError, match="TP x PP x CP = 3 must divide world_size"):
        check_train_batch(config(1, 1, 16, "megatron_train", tensor_model_parallel_size=3), "actor_train", 48)


@pytest.mark.parametrize(
    "rollout, n, pbs, world, tp, pp, cp",
    [
        (64, 8, 1, 16, 1, 1, 1),  # the guide's RLVR example: 512 samples over 16 DeepSpeed ranks -> ga 32
        (64, 8, 2, 16, 2, 2, 1),  # Megatron TP 2 x PP 2
        (32, 1, 8, 1, 1, 1, 1),  # agentic: 32 trajectories on one CPU worker
    ],
)
def test_guide_formula_gives_one_optimizer_step_per_rollout(rollout, n, pbs, world, tp, pp, cp):
    ga = rollout * n * tp * pp * cp // pbs // world  # the guide's gradient_accumulation_steps
    strategy = "megatron_train" if tp * pp * cp > 1 else "deepspeed_train"
    cfg = config(
        pbs,
        ga,
        world,
        strategy,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
    )
    check_train_batch(cfg, "actor_train", rollout * n)
    assert optimizer_steps_per_rollout(cfg, "actor_train", rollout * n) == 1
    half = config(
        pbs,
        ga // 2,
        world,
        strategy,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
    )
    assert optimizer_steps_per_rollout(half, "actor_train", rollout * n) == 2


def test_pipeline_batch_units_count_data_parallel_replicas_not_ranks():
    """The rollout's batch multiple and the actor's mini-batch use the data-parallel size: a TP=2 megatron role on
    two GPUs is one replica, so 8 x 16 x 1 = 128 samples make its optimizer step (with the world size, 256 > the
    128-sample rollout emptied every batch: found on two H100s)."""
    from roll.agentic.scheduler import train_batch_multiple
    from roll.config.loader import load_config
    from roll.ppo.epochs import actor_mini_batch

    cfg = load_config("sokoban_qwen05b_megatron_tp2")
    assert cfg.actor_train.world_size == 2
    assert train_batch_multiple(cfg) == actor_mini_batch(cfg) == 128 == cfg.rollout_batch_size
    tp1 = config(8, 16, 2, "megatron_train", tensor_model_parallel_size=1)
    assert train_batch_multiple(tp1) == actor_mini_batch(tp1) == 256
