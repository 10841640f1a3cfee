"""Pieces both pipelines use: starting the roles, phases, weight copies, metrics of a step, and the training
epochs of the actor and the critic (the update that calls them: :mod:`roll.pipelines.ppo`)."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch

from roll.algorithms.losses import ActorLossConfig
from roll.config.base import BaseConfig
from roll.config.validation import ROLES, global_train_batch
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.distributed.group import LocalWorkerGroup, RayWorkerGroup, WorkerGroup, start_notice
from roll.distributed.roles import CriticProxy, RoleProxy, Roles, TrainProxy
from roll.distributed.weight_sync import copy_weights
from roll.pipelines.loss_fns import CriticValueLoss, PPOActorLoss
from roll.strategies.base import StrategyContext



def start_roles(cfg: BaseConfig) -> Roles:
    """Start (Ray or local) the worker groups of every configured role, wrap them in their typed proxies (each
    role's strategy checked against the registry) and initialise their strategies."""
    workers = {r: getattr(cfg, r) for r in ROLES if getattr(cfg, r, None) is not None}
    for worker in workers.values():
        if not worker.model_args.model_name_or_path:
            worker.model_args.model_name_or_path = cfg.pretrain
    if cfg.distributed == "local":
        groups: dict[str, WorkerGroup] = {
            r: LocalWorkerGroup(r, w, num_threads=max(1, int(w.num_cpus_per_worker))) for r, w in workers.items()}
    else:
        from roll.distributed.cluster import start_ray

        needed = sum(w.num_cpus_per_worker * w.world_size for w in workers.values()) + 1
        start_ray(address=cfg.ray_address, num_cpus=cfg.ray_num_cpus or max(os.cpu_count() or 1, math.ceil(needed)),
                  num_gpus=cfg.num_gpus_per_node or None, include_dashboard=cfg.ray_include_dashboard,
                  env_vars=dict(cfg.system_envs))
        from roll.distributed.placement import check_feasible, create_placement_groups, plan_placement

        plan = plan_placement(workers, cfg.num_gpus_per_node)
        import ray

        check_feasible(plan, ray.cluster_resources())
        pgs = create_placement_groups(plan, timeout_s=min(cfg.rpc_timeout, 120))
        groups = {r: RayWorkerGroup(r, w, cfg.rpc_timeout, w.device_mapping, slots=plan.roles[r],
                                    placement_groups=pgs) for r, w in workers.items()}
    train_steps = cfg.max_steps * cfg.ppo_epochs * max(1, _optimizer_steps_per_rollout(cfg))
    ctx = StrategyContext(seed=cfg.seed, max_grad_norm=cfg.max_grad_norm, total_steps=train_steps,
                          max_running_requests=cfg.max_running_requests)
    roles = Roles.of(groups, cfg)
    for role, proxy in roles.items():
        with start_notice(role, cfg.rpc_timeout):
            proxy.initialize(ctx)
    return roles


def logprob_mismatch(engine_log_probs: torch.Tensor, mask: torch.Tensor, batch: Batch) -> dict[str, float]:
    """``mean |logp_inference - logp_train|`` over the generated tokens with an engine log-prob (``mask``), and the
    max, against the trainer's ``old_log_probs`` of the same tokens (log-prob frame, :mod:`roll.data.layout`);
    stores ``batch["rollout_log_probs"]`` for importance-sampling use. Empty when no token has an engine log-prob."""
    batch["rollout_log_probs"] = engine_log_probs
    count = float(mask.sum())
    if not count:
        return {}
    diff = (engine_log_probs - batch["old_log_probs"].float()).abs() * mask
    return {"rollout/logprob_mismatch": float(diff.sum()) / count, "rollout/logprob_mismatch_max": float(diff.max())}


def perf_metrics(roles: Roles, batch: Batch, timings: dict[str, float],
                 ppo_epochs: int) -> dict[str, float]:
    """Throughput and memory of one step: ``perf/tokens`` (attention-mask tokens of the batch),
    ``perf/train_tokens_per_s`` = tokens x ppo_epochs / time/train, and on GPU
    ``perf/<role>_peak_{allocated,reserved}_gib`` (rank 0 of each role, peak since the worker started) and
    ``perf/gpu_used_gib`` (the GPU's use by all processes, seen from actor_train's rank 0, at the end of the step)."""
    tokens = float(batch["attention_mask"].sum())
    out = {"perf/tokens": tokens, "perf/samples": float(len(batch)),
           "perf/train_tokens_per_s": tokens * ppo_epochs / max(timings.get("time/train", 0.0), 1e-9)}
    for role, proxy in roles.items():
        stats = proxy.memory_stats()
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
    samples = cfg.rollout_batch_size * max(1, getattr(cfg, "num_return_sequences_in_group", 1))
    return samples // global_train_batch(cfg.actor_train)


def sync_weights(train: TrainProxy, target: RoleProxy) -> float:
    """Copy actor_train's weights into every worker of ``target`` (reference, critic); returns seconds.

    actor_infer is synced by ``Pipeline.sync_infer`` (:class:`~roll.distributed.weight_sync.WeightSync`: NCCL
    broadcast when disaggregated, this copy otherwise)."""
    start = time.perf_counter()
    copy_weights(train, target)
    return time.perf_counter() - start


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
    """Samples of one actor optimizer step over all ranks: per_device x gradient_accumulation_steps x data-parallel
    size (:func:`roll.config.validation.global_train_batch`)."""
    return global_train_batch(cfg.actor_train)


def skip_old_log_probs(cfg: BaseConfig, batch_size: int, step: int) -> bool:
    """Whether step ``step``'s separate old-log-prob pass can be skipped because it would equal the training
    forward's (detached) log-probs: ``skip_old_log_probs`` on, the actor trains this step (past
    ``critic_warmup``), one ppo epoch, the whole batch one optimizer step (so the forward runs before any update),
    and no KL penalty in the reward (which needs the old log-probs first)."""
    return (cfg.skip_old_log_probs and step > cfg.critic_warmup and cfg.ppo_epochs == 1
            and batch_size == actor_mini_batch(cfg) and not cfg.add_token_level_kl)


def train_actor(cfg: BaseConfig, train: TrainProxy, batch: Batch, seed: int) -> dict[str, float]:
    """``ppo_epochs`` passes over shuffled mini-batches of the global train batch; mean metrics. Without
    ``old_log_probs`` in ``batch`` (:func:`skip_old_log_probs`), the training forward's log-probs are stored there."""
    skipped = "old_log_probs" not in batch
    required = ("advantages",) if skipped else ("old_log_probs", "advantages")
    check_batch_if(cfg.strict_data_check, batch, "train_step", required=required)
    loss_fn = PPOActorLoss(actor_loss_config(cfg))
    return _train_epochs(cfg.ppo_epochs, train, batch, actor_mini_batch(cfg), seed, loss_fn=loss_fn,
                         with_entropy=True, keep_log_probs=skipped)


def train_critic(cfg: BaseConfig, critic: CriticProxy, batch: Batch, seed: int) -> dict[str, float]:
    """The critic's ``ppo_epochs`` passes: clipped value loss (``value_clip``) of its values against
    ``batch["returns"]``, old values = ``batch["values"]``; mean ``critic/*`` metrics."""
    mini = global_train_batch(cfg.critic)
    return _train_epochs(cfg.ppo_epochs, critic, batch, mini, seed, loss_fn=CriticValueLoss(cfg.value_clip))


def _train_epochs(epochs: int, role: TrainProxy, batch: Batch, mini: int, seed: int, keep_log_probs: bool = False,
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
            results = role.train_step(batch.select(index), return_log_probs=keep_log_probs, **train_kwargs)
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
