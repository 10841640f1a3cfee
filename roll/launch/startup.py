"""Starting a run's roles: Ray (or local mode), placement, the worker groups behind their typed proxies, the
colocation phases, and the weight copy to the roles that only load weights (reference, critic)."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from roll.config.base import BaseConfig
from roll.config.lora import reference_from_actor
from roll.config.validation import optimizer_steps_per_rollout, worker_blocks
from roll.distributed.group import LocalWorkerGroup, RayWorkerGroup, WorkerGroup, start_notice
from roll.distributed.roles import RoleProxy, Roles, TrainProxy
from roll.distributed.worker import Worker
from roll.strategies.base import StrategyContext
from roll.weights.buckets import DEFAULT_BUCKET_BYTES
from roll.weights.sync import copy_weights


def start_roles(cfg: BaseConfig, extra_cpus: float = 0.0) -> Roles:
    """Start (Ray or local) the worker groups of every configured role, wrap them in their typed proxies (each
    role's strategy checked against the registry) and initialise their strategies. ``extra_cpus``: what the
    pipeline's other actors (env managers, reward workers) will reserve, counted when sizing a Ray it starts."""
    workers = started_workers(cfg)
    if cfg.reference is not None and "reference" not in workers:
        print(
            "[roll] reference: not started; with LoRA the reference log-probs are actor_train's with its adapters "
            "off, i.e. the base model's (actor_train.model_args.lora_reference: separate starts the reference block)",
            flush=True,
        )
    for worker in workers.values():
        if not worker.model_args.model_name_or_path:
            worker.model_args.model_name_or_path = cfg.pretrain
    if cfg.distributed == "local":
        groups: dict[str, WorkerGroup] = {
            r: LocalWorkerGroup(r, w, num_threads=max(1, int(w.num_cpus_per_worker))) for r, w in workers.items()
        }
    else:
        from roll.distributed.cluster import start_ray

        needed = sum(w.num_cpus_per_worker * w.world_size for w in workers.values()) + extra_cpus + 1
        start_ray(
            address=cfg.ray_address,
            num_cpus=cfg.ray_num_cpus or max(os.cpu_count() or 1, math.ceil(needed)),
            num_gpus=cfg.num_gpus_per_node or None,
            include_dashboard=cfg.ray_include_dashboard,
            env_vars=dict(cfg.system_envs),
        )
        from roll.distributed.placement import check_feasible, create_placement_groups, plan_placement

        plan = plan_placement(workers, cfg.num_gpus_per_node)
        import ray

        check_feasible(plan, ray.cluster_resources())
        pgs = create_placement_groups(plan, timeout_s=min(cfg.rpc_timeout, 120))
        groups = {
            r: RayWorkerGroup(r, w, cfg.rpc_timeout, w.device_mapping, slots=plan.roles[r], placement_groups=pgs)
            for r, w in workers.items()
        }
    samples = cfg.rollout_batch_size * max(1, getattr(cfg, "num_return_sequences_in_group", 1))
    per_rollout = optimizer_steps_per_rollout(cfg, "actor_train", samples)
    train_steps = cfg.max_steps * cfg.ppo_epochs * max(1, per_rollout)
    ctx = StrategyContext(
        seed=cfg.seed,
        max_grad_norm=cfg.max_grad_norm,
        total_steps=train_steps,
        max_running_requests=cfg.max_running_requests,
        async_rollouts=bool(getattr(cfg, "async_generation_ratio", 0)),
    )
    roles = Roles.of(groups, cfg)
    for role, proxy in roles.items():
        with start_notice(role, cfg.rpc_timeout):
            proxy.initialize(ctx)
        where = ""
        if cfg.distributed != "local":  # which node and GPUs each rank landed on (several nodes: see they spread)
            where = ": " + "; ".join(f"rank {r} on {loc}" for r, loc in enumerate(proxy.group.call(Worker.location)))
        print(
            f"[roll] {role}: {workers[role].strategy_args.strategy_name} on {workers[role].world_size} "
            f"worker(s){where}",
            flush=True,
        )
    return roles


def started_workers(cfg: BaseConfig) -> dict[str, Any]:
    """The worker blocks of the roles a run starts: every configured one, but the reference when actor_train
    scores it with its LoRA adapters off (:func:`roll.config.lora.reference_from_actor`)."""
    skip = {"reference"} if reference_from_actor(cfg) else set()
    return {role: worker for role, worker in worker_blocks(cfg).items() if role not in skip}


def colocation_phases(cfg: BaseConfig) -> Any:
    """The :class:`~roll.distributed.colocation.ColocationPhases` of ``cfg``'s started roles (no-op on CPU), with
    the ``colocated_offload`` policy."""
    from roll.distributed.colocation import ColocationPhases
    from roll.distributed.placement import plan_placement

    roles = started_workers(cfg)
    return ColocationPhases(plan_placement(roles, cfg.num_gpus_per_node).colocated, cfg.colocated_offload)


def sync_weights(train: TrainProxy, target: RoleProxy) -> float:
    """Copy actor_train's weights into every worker of ``target`` (reference, critic); returns seconds.

    actor_infer is synced by ``Pipeline.sync_infer`` (:class:`~roll.weights.sync.WeightSync`, set up by
    :func:`roll.launch.weight_sync.weight_sync`)."""
    start = time.perf_counter()
    copy_weights(train.weights_out, target.weights_in, DEFAULT_BUCKET_BYTES)
    return time.perf_counter() - start
