"""Pieces both pipelines use: worker-group setup, weight sync, the reward -> advantage step, actor training."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch

from roll.algorithms.advantages import (AdvantageInputs, compute_advantage, discounted_turn_returns,
                                       step_level_advantages, whiten_and_clip_advantages)
from roll.algorithms.kl import apply_kl_penalty
from roll.algorithms.losses import ActorLossConfig, explained_variance
from roll.algorithms.masking import masked_mean, masked_whiten
from roll.config.base import BaseConfig
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.distributed.group import LocalWorkerGroup, RayWorkerGroup, WorkerGroup, start_notice
from roll.distributed.weight_sync import copy_weights
from roll.pipelines.loss_fns import CriticValueLoss, PPOActorLoss, loss_mask
from roll.strategies.base import StrategyContext

ROLES = ("actor_train", "actor_infer", "reference", "critic")


def start_workers(cfg: BaseConfig) -> dict[str, WorkerGroup]:
    """Start (Ray or local) the worker groups of every configured role and initialise their strategies."""
    roles = {r: getattr(cfg, r) for r in ROLES if getattr(cfg, r, None) is not None}
    for worker in roles.values():
        if not worker.model_args.model_name_or_path:
            worker.model_args.model_name_or_path = cfg.pretrain
    if cfg.distributed == "local":
        groups: dict[str, WorkerGroup] = {
            r: LocalWorkerGroup(r, w, num_threads=max(1, int(w.num_cpus_per_worker))) for r, w in roles.items()}
    else:
        from roll.distributed.cluster import start_ray

        needed = sum(w.num_cpus_per_worker * w.world_size for w in roles.values()) + 1
        start_ray(address=cfg.ray_address, num_cpus=cfg.ray_num_cpus or max(os.cpu_count() or 1, math.ceil(needed)),
                  num_gpus=cfg.num_gpus_per_node or None, include_dashboard=cfg.ray_include_dashboard,
                  env_vars=dict(cfg.system_envs))
        from roll.distributed.placement import check_feasible, create_placement_groups, plan_placement

        plan = plan_placement(roles, cfg.num_gpus_per_node)
        import ray

        check_feasible(plan, ray.cluster_resources())
        pgs = create_placement_groups(plan, timeout_s=min(cfg.rpc_timeout, 120))
        groups = {r: RayWorkerGroup(r, w, cfg.rpc_timeout, w.device_mapping, slots=plan.roles[r],
                                    placement_groups=pgs) for r, w in roles.items()}
    train_steps = cfg.max_steps * cfg.ppo_epochs * max(1, _optimizer_steps_per_rollout(cfg))
    ctx = StrategyContext(seed=cfg.seed, max_grad_norm=cfg.max_grad_norm, total_steps=train_steps)
    for role, group in groups.items():
        with start_notice(role, cfg.rpc_timeout):
            group.call("initialize", ctx)
    return groups


def perf_metrics(groups: dict[str, WorkerGroup], batch: Batch, timings: dict[str, float],
                 ppo_epochs: int) -> dict[str, float]:
    """Throughput and memory of one step: ``perf/tokens`` (attention-mask tokens of the batch),
    ``perf/train_tokens_per_s`` = tokens x ppo_epochs / time/train, and on GPU
    ``perf/<role>_peak_{allocated,reserved}_gib`` (rank 0 of each role, peak since the worker started) and
    ``perf/gpu_used_gib`` (the GPU's use by all processes, seen from actor_train's rank 0, at the end of the step)."""
    tokens = float(batch["attention_mask"].sum())
    out = {"perf/tokens": tokens, "perf/samples": float(len(batch)),
           "perf/train_tokens_per_s": tokens * ppo_epochs / max(timings.get("time/train", 0.0), 1e-9)}
    for role, group in groups.items():
        stats = group.call_rank0("memory_stats")
        for key in ("peak_allocated_gib", "peak_reserved_gib"):
            if key in stats:
                out[f"perf/{role}_{key}"] = stats[key]
        if role == "actor_train" and "gpu_used_gib" in stats:
            out["perf/gpu_used_gib"] = stats["gpu_used_gib"]
    return out


def colocation_phases(cfg: BaseConfig) -> Any:
    """The :class:`~roll.distributed.colocation.ColocationPhases` of ``cfg``'s roles (no-op on CPU), with the
    ``colocated_offload`` policy."""
    from roll.distributed.colocation import ColocationPhases
    from roll.distributed.placement import plan_placement

    roles = {r: getattr(cfg, r) for r in ROLES if getattr(cfg, r, None) is not None}
    return ColocationPhases(plan_placement(roles, cfg.num_gpus_per_node).colocated, cfg.colocated_offload)


def _optimizer_steps_per_rollout(cfg: BaseConfig) -> int:
    ta, world = cfg.actor_train.training_args, cfg.actor_train.world_size
    samples = cfg.rollout_batch_size * max(1, getattr(cfg, "num_return_sequences_in_group", 1))
    return samples // (ta.per_device_train_batch_size * ta.gradient_accumulation_steps * world)


def sync_weights(train: WorkerGroup, target: WorkerGroup) -> float:
    """Copy actor_train's weights into every worker of ``target`` (reference, critic); returns seconds.

    actor_infer is synced by ``Pipeline.sync_infer`` (:class:`~roll.distributed.weight_sync.WeightSync`: NCCL
    broadcast when disaggregated, this copy otherwise)."""
    start = time.perf_counter()
    copy_weights(train, target)
    return time.perf_counter() - start


def forward_log_probs(group: WorkerGroup, batch: Batch) -> torch.Tensor:
    """(B, L-1) log-probs of ``batch`` from a worker group, data parallel."""
    return torch.cat([part["log_probs"] for part in group.call_dp("compute_log_probs", batch)])


def normalized_token_rewards(batch: Batch, normalized_scores: torch.Tensor) -> torch.Tensor:
    """Put each sample's (normalized) score on its last response token: (B, L-1)."""
    rewards = torch.zeros_like(batch["token_level_scores"])
    mask = loss_mask(batch)
    last = mask.shape[1] - 1 - torch.flip(mask, dims=[1]).argmax(dim=1)  # index of the last 1 per row
    has = mask.sum(1) > 0
    rewards[has, last[has]] = normalized_scores[has].to(rewards.dtype)
    return rewards


def compute_advantages(cfg: BaseConfig, batch: Batch, scores: torch.Tensor, group_ids: torch.Tensor | None,
                       kl_coef: float) -> dict[str, float]:
    """Token rewards (+ KL penalty) -> advantages/returns stored in ``batch``; returns metrics."""
    metrics: dict[str, float] = {}
    mask = loss_mask(batch)
    rewards = normalized_token_rewards(batch, scores)
    if cfg.add_token_level_kl:
        rewards, kl_metrics = apply_kl_penalty(rewards, batch["old_log_probs"], batch["ref_log_probs"], mask,
                                               kl_coef, cfg.kl_penalty)
        metrics.update(kl_metrics)
    if cfg.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    values = batch.tensors.get("values")
    # gigpo = grpo episode advantages + step-level (same-state) advantages from the per-turn data of the batch
    estimator = "grpo" if cfg.adv_estimator == "gigpo" else cfg.adv_estimator
    out = compute_advantage(estimator, AdvantageInputs(rewards, mask, values=values, group_ids=group_ids,
                                                       gamma=cfg.gamma, lambd=cfg.lambd))
    if cfg.adv_estimator == "gigpo":
        out.advantages = gigpo_token_advantages(cfg, batch, out.advantages, mask, group_ids)
        out.returns = out.advantages.clone()
    batch["advantages"] = whiten_and_clip_advantages(out.advantages, mask, cfg.whiten_advantages, cfg.advantage_clip)
    batch["returns"] = out.returns
    metrics.update(value_metrics(values, out.returns, mask))
    check_batch_if(cfg.strict_data_check, batch, "advantages", required=("advantages", "returns"))
    metrics.update({"critic/advantages_mean": float(masked_mean(batch["advantages"], mask)),
                    "critic/advantages_max": float(batch["advantages"][mask.bool()].max()) if mask.any() else 0.0,
                    "critic/advantages_min": float(batch["advantages"][mask.bool()].min()) if mask.any() else 0.0,
                    "critic/returns_mean": float(masked_mean(out.returns, mask)),
                    "critic/returns_max": float(out.returns[mask.bool()].max()) if mask.any() else 0.0,
                    "critic/returns_min": float(out.returns[mask.bool()].min()) if mask.any() else 0.0,
                    "critic/score_mean": float(scores.mean())})
    return metrics


def value_metrics(values: torch.Tensor | None, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Critic diagnostics before its update: ``critic/values_mean`` and ``critic/explained_variance``
    (``1 - Var[R - V] / Var[R]`` over response tokens); empty without a critic."""
    if values is None:
        return {}
    return {"critic/values_mean": float(masked_mean(values, mask)),
            "critic/explained_variance": float(explained_variance(values, returns, mask))}


def gigpo_token_advantages(cfg: BaseConfig, batch: Batch, episode_adv: torch.Tensor, mask: torch.Tensor,
                           group_ids: torch.Tensor | None) -> torch.Tensor:
    """GiGPO advantages (B, L-1): each turn's combined advantage on that turn's response tokens.

    Per turn k of sample i: return ``G_k`` (:func:`discounted_turn_returns` of the turn rewards, ``cfg.gamma`` per
    turn), state = the observation the turn acted on; :func:`step_level_advantages` normalizes ``G`` within the
    turns of one rollout group that share a state (``cfg.step_adv_norm``) and adds ``episode_adv_weight x`` the
    sample's episode advantage (``episode_adv``, GRPO's, constant over its response tokens).
    Needs batch metadata ``step_rewards``, ``turn_states`` and ``turn_spans`` ((start, end) index ranges in the
    log-prob frame), which the agentic pipeline attaches; pipelines without turns cannot use gigpo.
    """
    missing = [k for k in ("step_rewards", "turn_states", "turn_spans") if k not in batch]
    if missing:
        raise ValueError(f"adv_estimator=gigpo needs per-turn batch metadata {missing}; only the agentic pipeline "
                         "provides turns (use grpo for single-turn data)")
    groups = group_ids if group_ids is not None else torch.zeros(len(batch), dtype=torch.long)
    per_sample = masked_mean(episode_adv, mask, dim=-1)  # (B,): the constant episode advantage of each sample
    state_index: dict[str, int] = {}
    rows: list[tuple[int, int, int]] = []  # (sample, span start, span end) per turn
    rewards, episodes, turn_groups, states, ep_adv = [], [], [], [], []
    for i in range(len(batch)):
        for reward, state, (start, end) in zip(batch["step_rewards"][i], batch["turn_states"][i],
                                               batch["turn_spans"][i]):
            rows.append((i, start, end))
            rewards.append(float(reward))
            episodes.append(i)
            turn_groups.append(int(groups[i]))
            states.append(state_index.setdefault(state, len(state_index)))
            ep_adv.append(float(per_sample[i]))
    out = torch.zeros_like(episode_adv)
    if not rows:
        return out
    returns = discounted_turn_returns(torch.tensor(rewards), torch.tensor(episodes), cfg.gamma)
    turn_adv = step_level_advantages(returns, torch.tensor(turn_groups), torch.tensor(states), torch.tensor(ep_adv),
                                     episode_weight=cfg.episode_adv_weight, step_weight=cfg.step_adv_weight,
                                     method=cfg.step_adv_norm)
    for (i, start, end), adv in zip(rows, turn_adv.tolist()):
        out[i, start:end] = adv
    return out * mask


def actor_loss_config(cfg: BaseConfig) -> ActorLossConfig:
    """The actor loss settings from the config's PPO keys; ``seq-mean-token-sum-norm`` divides by the fixed
    ``sequence_length`` (never by a micro-batch's padded width, which varies)."""
    return ActorLossConfig(pg_clip=cfg.pg_clip, pg_clip_low=cfg.pg_clip_low, pg_clip_high=cfg.pg_clip_high,
                           dual_clip_loss=cfg.dual_clip_loss, dual_clip_c=cfg.dual_clip_c,
                           loss_agg_mode=cfg.loss_agg_mode, norm_len=cfg.sequence_length,
                           entropy_loss_coef=cfg.entropy_loss_coef,
                           use_kl_loss=cfg.use_kl_loss, kl_loss_coef=cfg.kl_loss_coef,
                           kl_loss_type=cfg.kl_loss_type, policy_loss=cfg.policy_loss)


def actor_mini_batch(cfg: BaseConfig) -> int:
    """Samples of one actor optimizer step over all ranks: per_device x gradient_accumulation_steps x world."""
    ta = cfg.actor_train.training_args
    return ta.per_device_train_batch_size * ta.gradient_accumulation_steps * cfg.actor_train.world_size


def skip_old_log_probs(cfg: BaseConfig, batch_size: int, step: int) -> bool:
    """Whether step ``step``'s separate old-log-prob pass can be skipped because it would equal the training
    forward's (detached) log-probs: ``skip_old_log_probs`` on, the actor trains this step (past
    ``critic_warmup``), one ppo epoch, the whole batch one optimizer step (so the forward runs before any update),
    and no KL penalty in the reward (which needs the old log-probs first)."""
    return (cfg.skip_old_log_probs and step > cfg.critic_warmup and cfg.ppo_epochs == 1
            and batch_size == actor_mini_batch(cfg) and not cfg.add_token_level_kl)


def train_actor(cfg: BaseConfig, train: WorkerGroup, batch: Batch, seed: int) -> dict[str, float]:
    """``ppo_epochs`` passes over shuffled mini-batches of the global train batch; mean metrics. Without
    ``old_log_probs`` in ``batch`` (:func:`skip_old_log_probs`), the training forward's log-probs are stored there."""
    skipped = "old_log_probs" not in batch
    required = ("advantages",) if skipped else ("old_log_probs", "advantages")
    check_batch_if(cfg.strict_data_check, batch, "train_step", required=required)
    loss_fn = PPOActorLoss(actor_loss_config(cfg))
    return _train_epochs(cfg.ppo_epochs, train, batch, actor_mini_batch(cfg), seed, loss_fn=loss_fn,
                         with_entropy=True, keep_log_probs=skipped)


def train_critic(cfg: BaseConfig, critic: WorkerGroup, batch: Batch, seed: int) -> dict[str, float]:
    """The critic's ``ppo_epochs`` passes: clipped value loss (``value_clip``) of its values against
    ``batch["returns"]``, old values = ``batch["values"]``; mean ``critic/*`` metrics."""
    ta = cfg.critic.training_args
    mini = ta.per_device_train_batch_size * ta.gradient_accumulation_steps * critic.world_size
    return _train_epochs(cfg.ppo_epochs, critic, batch, mini, seed, loss_fn=CriticValueLoss(cfg.value_clip))


def forward_values(group: WorkerGroup, batch: Batch) -> torch.Tensor:
    """(B, L-1) critic values of ``batch``, data parallel."""
    return torch.cat([part["values"] for part in group.call_dp("compute_values", batch)])


def _train_epochs(epochs: int, group: WorkerGroup, batch: Batch, mini: int, seed: int, keep_log_probs: bool = False,
                  **train_kwargs: Any) -> dict[str, float]:
    """``epochs`` passes over shuffled mini-batches of ``mini`` samples (one ``train_step`` each); mean metrics.

    ``keep_log_probs`` (one epoch, one mini-batch): store the training forward's log-probs as
    ``batch["old_log_probs"]``, in batch order."""
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, float] = {}
    count = 0
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=gen)
        for start in range(0, len(batch), mini):
            index = order[start:start + mini]
            results = group.call_dp("train_step", batch.select(index), return_log_probs=keep_log_probs,
                                    **train_kwargs)
            if keep_log_probs:
                kept = torch.cat([r.pop("log_probs") for r in results])  # rank chunks are consecutive
                old = torch.zeros(len(batch), kept.shape[1])
                old[index] = kept
                batch["old_log_probs"] = old
            for rank_metrics in results:
                for k, v in rank_metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
    return {k: v / max(1, count) for k, v in sums.items()}


def group_keys(grouping: str, batch: Batch) -> torch.Tensor | None:
    """Group ids for reward normalization: same-seed group (state), env tag (inductive) or None (batch)."""
    if grouping == "batch":
        return None
    key = "group_id" if grouping == "state" else "tag"
    index: dict[Any, int] = {}
    return torch.tensor([index.setdefault(v, len(index)) for v in batch[key]], dtype=torch.long)
