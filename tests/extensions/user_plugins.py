"""A user module, as a project outside roll would write one: an advantage estimator, a policy loss, a reward, an env,
a tracker and a training backend, each registered with roll's decorator or register function. Configs name them as
``"tests.extensions.user_plugins:<name>"``; importing this module (roll does it when it meets the name) registers
them."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from roll.algorithms.advantages import AdvantageInputs, AdvantageOutputs, register_advantage
from roll.algorithms.aggregation import agg_loss
from roll.algorithms.policy_losses import register_policy_loss
from roll.algorithms.reward_norm import register_reward_norm_scope, register_score_norm
from roll.envs.base import TextEnv, Transition
from roll.envs.registry import register_env
from roll.rewards.registry import RewardResult, register_reward
from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
from roll.strategies.registry import register_strategy
from roll.tracking import StdoutTracker, TrackerOptions, register_tracker

MODULE = "tests.extensions.user_plugins"


@register_advantage("fixed_baseline")
@torch.no_grad()
def fixed_baseline(inputs: AdvantageInputs) -> AdvantageOutputs:
    """``A_i = R_i - 0.5`` on every response token (a constant baseline; no critic, no groups)."""
    mask = inputs.response_mask
    episode = (inputs.token_level_rewards * mask).sum(-1)  # (B,)
    adv = (episode - 0.5)[:, None] * mask
    return AdvantageOutputs(advantages=adv, returns=adv.clone())


@register_advantage("scaled_baseline")
@torch.no_grad()
def scaled_baseline(inputs: AdvantageInputs, *, baseline: float = 0.5, scale: float = 1.0) -> AdvantageOutputs:
    """``A_i = scale * (R_i - baseline)`` on every response token: an estimator with its own hyperparameters
    (set by ``adv_estimator_args``)."""
    mask = inputs.response_mask
    adv = (scale * ((inputs.token_level_rewards * mask).sum(-1) - baseline))[:, None] * mask
    return AdvantageOutputs(advantages=adv, returns=adv.clone())


@register_advantage("needs_a_critic", needs_critic=True)
@torch.no_grad()
def needs_a_critic(inputs: AdvantageInputs) -> AdvantageOutputs:
    """``A = R - V`` per token: declares that it needs critic values."""
    adv = (inputs.token_level_rewards - inputs.values) * inputs.response_mask
    return AdvantageOutputs(advantages=adv, returns=inputs.token_level_rewards.clone())


@register_policy_loss("vanilla_pg")
def vanilla_pg(
    log_probs,
    old_log_probs,
    advantages,
    mask,
    *,
    clip_low=0.2,
    clip_high=0.2,
    dual_clip=None,
    loss_agg_mode="token-mean",
    norm_len=None,
):
    """REINFORCE with the importance ratio and no clip: ``l = -A exp(logp - old_logp)``."""
    loss = agg_loss(-advantages * torch.exp(log_probs - old_log_probs), mask, loss_agg_mode, norm_len)
    return loss, {"actor/pg_loss": loss.detach().item()}


@register_reward("exact_text", needs_ground_truth=True)
def exact_text(response: str, ground_truth: str, *, bonus: float = 1.0) -> RewardResult:
    """``bonus`` if the stripped response equals the ground truth, else 0."""
    correct = response.strip() == ground_truth.strip()
    return RewardResult(score=bonus if correct else 0.0, correct=correct, extracted=response.strip(), format_ok=True)


@register_reward_norm_scope("median_scope")
def median_scope(scores: torch.Tensor, group_ids, shift: bool, scale: bool, running) -> torch.Tensor:
    """RLVR ``reward_norm``: subtract the batch median (``shift``/``scale`` are ignored). (B,) -> (B,)."""
    return scores - scores.median()


@register_score_norm("median_norm")
def median_norm(scores: torch.Tensor, group_ids) -> torch.Tensor:
    """Agentic ``reward_normalization.method``: subtract the batch median (a formula of its own: it declares no
    ``norm_types``, so norm_mean_type / norm_std_type cannot be set with it). (B,) -> (B,)."""
    return scores - scores.median()


@register_env("count_up")
class CountUp(TextEnv):
    """Say the next number.

    Action space: an integer in ``<answer>...</answer>``.
    Observation space: ``"Say {n}."``.
    Starting state: n = 1 + (a number from the seed) % 3.
    Rewards: 1 for the right number, 0 for a wrong one, ``format_penalty`` for a non-number.
    Episode end: truncated after ``max_steps`` answers.
    Info: the base keys.

    Args:
        max_steps, format_penalty, action_format, render_mode: see ``TextEnv``.
    """

    def __init__(self, max_steps: int = 2, **kwargs: Any) -> None:
        super().__init__(max_steps=max_steps, **kwargs)
        self.n = 1

    def instruction(self) -> str:
        return "Say the number you are asked to say, like <answer>2</answer>."

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        self.n = 1 + int(rng.integers(0, 3))
        return self._observation()

    def _canonical_action(self, parsed: str) -> str | None:
        return parsed.strip() if parsed.strip().isdigit() else None

    def _apply(self, action: str) -> Transition:
        correct = int(action) == self.n
        self.n += 1
        return Transition(self._observation(), float(correct), False, success=correct)

    def _observation(self) -> str:
        return f"Say {self.n}."


@dataclasses.dataclass
class TallyOptions(TrackerOptions):
    """``tracker_kwargs`` of ``tally``."""

    file_name: str = dataclasses.field(default="tally.json", metadata={"help": "File in logging_dir."})


@register_tracker("tally")
class TallyTracker(StdoutTracker):
    """The stdout tracker that also writes, at ``finish``, how many values each step logged (``tally.json``)."""

    options_cls = TallyOptions

    def __init__(self, *, log_dir: str, options: TrackerOptions, **kwargs: Any) -> None:
        super().__init__(log_dir=log_dir, options=options, **kwargs)
        self.path, self.counts = os.path.join(log_dir, options.file_name), {}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        super().log(metrics, step)
        self.counts[step] = self.counts.get(step, 0) + len(metrics)

    def finish(self) -> None:
        super().finish()
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(self.counts, f)


class CountingDeepSpeed(DeepSpeedTrainStrategy):
    """``deepspeed_train`` that counts its optimizer steps into the metrics (``actor/user_steps``): a training
    backend as a small subclass of an existing one."""

    def train_step(self, batch, loss_fn, lr=None, with_entropy=False, return_log_probs=False):
        metrics = super().train_step(batch, loss_fn, lr, with_entropy, return_log_probs)
        metrics["actor/user_steps"] = float(self.optimizer_steps)
        return metrics


register_strategy(
    "counting_deepspeed",
    f"{MODULE}:CountingDeepSpeed",
    {"actor_train"},
    requires="deepspeed",
    module="deepspeed",
    packages=("deepspeed",),
    options="roll.config.strategies:DeepSpeedTrainOptions",
)
