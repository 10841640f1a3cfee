"""The outer loop over optimizer steps and the learning-rate schedule every training backend shares
(``roll/strategies/accumulation.py: ScheduledSteps``): rates checked against hand-computed values, the step count
advanced only on the schedule, and one definition for DeepSpeed, FSDP2 and Megatron."""

from __future__ import annotations

import math

import pytest
import torch

from roll.config.worker import WorkerConfig
from roll.data.batch import Batch
from roll.strategies import registry
from roll.strategies.accumulation import ScheduledSteps


class _Steps(ScheduledSteps):
    """The loop without a backend: ``one_step`` records the rate it was given."""

    def __init__(self, total: int, **training_args):
        self.config = WorkerConfig()
        for key, value in training_args.items():
            setattr(self.config.training_args, key, value)
        self.total_steps, self.optimizer_steps, self.rates = total, 0, []

    def one_step(self, step: Batch, rate: float) -> tuple[dict[str, float], None]:
        self.rates.append(rate)
        return {"actor/loss": float(len(step))}, None


def _rates(steps: _Steps, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(steps.scheduled_lr())
        steps.optimizer_steps += 1
    return out


def test_warmup_then_linear_and_cosine_decay():
    # warmup 2 of 6 steps: peak * (step + 1) / 2, then frac = (step - 2) / 4 -> peak * (1 - frac)
    linear = _Steps(6, learning_rate=1.0, warmup_steps=2, lr_scheduler_type="linear")
    assert _rates(linear, 7) == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    cosine = _Steps(6, learning_rate=2.0, warmup_steps=0, lr_scheduler_type="cosine")
    want = [2.0 * 0.5 * (1 + math.cos(math.pi * s / 6)) for s in range(7)]  # 2, 1.866, 1.5, 1, 0.5, 0.134, 0
    assert _rates(cosine, 7) == pytest.approx(want)
    assert _rates(_Steps(6, learning_rate=0.3), 3) == [0.3, 0.3, 0.3]  # constant (the default)


def _batch(n: int) -> Batch:
    ids = torch.ones((n, 4), dtype=torch.long)
    return Batch({"input_ids": ids, "attention_mask": ids})


def test_steps_advance_the_schedule_and_a_given_rate_does_not():
    steps = _Steps(4, learning_rate=1.0, warmup_steps=4, per_device_train_batch_size=2)
    out = steps.run_steps(_batch(4), None, False, "actor", steps.one_step)  # 2 optimizer steps of 2 samples
    assert steps.rates == [0.25, 0.5] and steps.optimizer_steps == 2
    assert out["actor/lr"] == pytest.approx(0.375) and out["actor/loss"] == 2.0  # the steps' mean
    steps.run_steps(_batch(2), 0.1, False, "actor", steps.one_step)  # warm start: a fixed rate
    assert steps.rates[-1] == 0.1 and steps.optimizer_steps == 2
    with pytest.raises(ValueError, match=r"megatron_train train_step: 3 samples .* 2 x 1"):
        steps.run_steps(_batch(3), None, False, "megatron_train", steps.one_step)


@pytest.mark.parametrize("name", ["deepspeed_train", "fsdp2_train", "megatron_train"])
def test_every_training_backend_runs_the_one_loop_and_schedule(name):
    for role in ("actor_train", "critic"):
        cls = registry.get_strategy_class(name, role)
        assert issubclass(cls, ScheduledSteps)
        assert cls.scheduled_lr is ScheduledSteps.scheduled_lr and cls.run_steps is ScheduledSteps.run_steps
