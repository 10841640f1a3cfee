"""``trajectory_mode: step`` trains like ``traj`` on an append-only template: the same episodes as one sample each
or as one sample per turn give the same advantages on every generated token and the same gradient (the real
advantage step, the real actor loss and a real DeepSpeed step of a tiny model, fp32), in one optimizer step per
batch of episodes; without the per-episode loss weights the gradients differ (the check can fail)."""

from __future__ import annotations

import os

import pytest
import torch

from roll.config.agentic import AgenticConfig
from roll.data.batch import Batch
from roll.data.layout import loss_mask, trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn
from roll.ppo import epochs
from roll.ppo.advantage_step import advantage_step

TURNS = [1, 3, 2, 4]  # turns of the four episodes (groups of two share a seed)


pytestmark = pytest.mark.usefixtures("dist_env")  # one-rank torch.distributed environment (conftest)


def episodes(seed: int = 0) -> list[Trajectory]:
    """Four episodes with turns of different lengths (prompt deltas 2-5 tokens, replies 1-6), varied rewards
    and states that repeat across a group (GiGPO's step groups)."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 500, (n,), generator=gen).tolist()

    out = []
    for e, n in enumerate(TURNS):
        turns = []
        for k in range(n):
            reply = ids(int(torch.randint(1, 7, (1,), generator=gen)))
            turns.append(
                Turn(
                    ids(int(torch.randint(2, 6, (1,), generator=gen))),
                    reply,
                    [0.0] * len(reply),
                    observation=f"state{k % 2}",
                    reward=float(torch.randn(1, generator=gen)),
                )
            )
        out.append(Trajectory(f"e{e}", env_id=e % 2, group_id=e // 2, tag="x", seed=0, turns=turns))
    return out


def config(mode: str, estimator: str) -> AgenticConfig:
    cfg = AgenticConfig()
    cfg.adv_estimator, cfg.loss_agg_mode, cfg.sequence_length, cfg.ppo_epochs = estimator, mode, 256, 1
    cfg.actor_train.training_args.per_device_train_batch_size = 2
    cfg.actor_train.training_args.gradient_accumulation_steps = 2  # 4 episodes: one optimizer step
    return cfg


def strategy(model_dir: str):
    from roll.config.worker import WorkerConfig
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = True
    cfg.strategy_args.strategy_name = "deepspeed_train"
    cfg.strategy_args.strategy_config = {"zero_stage": 0}
    cfg.training_args.per_device_train_batch_size = 2
    cfg.training_args.gradient_accumulation_steps = 2
    out = build_strategy(cfg, "actor_train")
    out.initialize(StrategyContext(seed=0, max_grad_norm=1e9, total_steps=10))  # no clipping
    return out


class OneRank:
    """The strategy as a one-rank role (``train_step`` returns one dict per rank)."""

    def __init__(self, s):
        self.s = s

    def train_step(self, batch: Batch, loss_fn, **kwargs):
        return [self.s.train_step(batch, loss_fn, **kwargs)]


def train(model_dir: str, cfg: AgenticConfig, batch: Batch):
    """The update's actor step on ``batch`` (old log-probs from the same weights): the applied gradient (read
    back from Adam's first moment after one step) and the strategy."""
    s = strategy(model_dir)
    batch["old_log_probs"] = s.compute_log_probs(batch)["log_probs"]
    s.metrics = epochs.train_actor(cfg, OneRank(s), batch, seed=0)
    beta1 = s.config.training_args.adam_beta1
    state = s.torch_optimizer.state
    grad = torch.cat([(state[p]["exp_avg"] / (1 - beta1)).flatten() for p in s.engine.module.parameters()])
    return grad, s


def both_layouts(estimator: str, mode: str) -> tuple[Batch, Batch]:
    trajs = episodes()
    traj, step = (trajectories_to_batch(trajs, 0, m) for m in ("traj", "step"))
    for batch in (traj, step):
        advantage_step(config(mode, estimator), batch, kl_coef=0.0)
    return traj, step


def generated_values(batch: Batch, key: str) -> list[float]:
    """``key``'s values on generated tokens, episode by episode, turn by turn."""
    mask = loss_mask(batch["response_mask"]).bool()
    return [float(v) for row, m in zip(batch[key], mask) for v in row[m]]


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_every_turn_gets_its_episode_advantage(estimator):
    traj, step = both_layouts(estimator, "seq-mean-token-mean")
    assert len(traj) == 4 and len(step) == sum(TURNS)
    want = generated_values(traj, "advantages")
    # advantages that differ across episodes (grpo: +-0.71 in groups of two) and, with gigpo, across turns
    assert len(set(round(v, 5) for v in want)) > (2 if estimator == "gigpo" else 1)
    assert generated_values(step, "advantages") == pytest.approx(want, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"])
def test_step_samples_give_the_traj_gradient(tiny_model_dir, mode, monkeypatch):
    traj, step = both_layouts("gigpo", mode)
    cfg = config(mode, "gigpo")
    fresh = step.select(range(len(step)))  # a copy without the loss weights the update adds
    want, s_traj = train(tiny_model_dir, cfg, traj)
    got, s_step = train(tiny_model_dir, cfg, step)
    assert s_traj.optimizer_steps == s_step.optimizer_steps == 1  # one step per batch of episodes (ROLL #409)
    assert float(want.norm()) > 0
    cosine = float(torch.nn.functional.cosine_similarity(got, want, dim=0))
    assert cosine >= 0.9999 and float(got.norm() / want.norm()) == pytest.approx(1.0, abs=1e-3), (cosine, mode)
    assert s_step.metrics["actor/pg_loss"] == pytest.approx(s_traj.metrics["actor/pg_loss"], rel=1e-4, abs=1e-7)
    if mode == "token-mean":
        return  # every token is its own unit: no episode weights to remove
    monkeypatch.setattr(epochs, "add_episode_loss_weights", lambda *args: None)
    broken, _ = train(tiny_model_dir, cfg, fresh)
    cosine = float(torch.nn.functional.cosine_similarity(broken, want, dim=0))
    ratio = float(broken.norm() / want.norm())
    assert cosine < 0.9999 or abs(ratio - 1) > 0.05, (cosine, ratio)  # a long episode outweighs a short one


@pytest.mark.slow
def test_native_env_manager_trains_step_samples_with_a_critic(tmp_path, tiny_model_dir):
    """roll's own env manager (token history) with ``trajectory_mode: step``, PPO with a critic (GAE) and KL in
    the reward: values, old and reference log-probs go through the episode view; one local step end to end."""
    import json
    import math
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    overrides = [
        "distributed=local",
        f"pretrain={tiny_model_dir}",
        f"output_dir={tmp_path}/out",
        f"logging_dir={tmp_path}/logs",
        "max_steps=1",
        "eval_steps=0",
        "track_with=stdout",
        "val_env_manager=null",
        "sft_warmup.enabled=false",
        "zero_signal_patience=0",
        "rollout_batch_size=8",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=4",
        "sequence_length=512",
        "custom_envs.SimpleSokoban.max_actions_per_traj=3",
        "custom_envs.SimpleSokoban.max_tokens_per_step=6",
        "custom_envs.SimpleSokoban.trajectory_mode=step",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=2",
        "critic.training_args.per_device_train_batch_size=4",
        "critic.training_args.gradient_accumulation_steps=2",
    ]
    cmd = [
        sys.executable,
        str(repo / "examples" / "start_agentic_pipeline.py"),
        "--config-name",
        "algo_ppo",
        *overrides,
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["step"] == 1]
    assert row["perf/samples"] > row["rollout/batch_size"] == 8  # one sample per turn
    assert row["rollout/template_breaks"] == 0  # token history: no turn starts a sample of its own
    for key in (
        "actor/pg_loss",
        "actor/grad_norm",
        "critic/vf_loss",
        "critic/grad_norm",
        "actor/reward_kl",
        "critic/advantages_mean",
        "actor/lr",
    ):
        assert key in row and math.isfinite(row[key]), key
