"""Data parallel on CPU: two ``actor_train`` Ray workers (DeepSpeed over gloo) == one worker, same global batch.

Also checks that the placement plan puts each worker in its own placement-group bundle and that an infeasible
request fails fast, naming what is missing.
"""

from __future__ import annotations

import pytest
import torch

from roll.config.worker import WorkerConfig
from roll.data.batch import Batch
from roll.distributed.group import RayWorkerGroup
from roll.distributed.placement import check_feasible, create_placement_groups, plan_placement
from roll.distributed.roles import ActorProxy
from roll.strategies.base import StrategyContext

GLOBAL_BATCH, SEQ = 4, 12


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    from roll.distributed.cluster import start_ray

    if ray.is_initialized():  # an earlier module's Ray: this module's checks count this cluster's 4 CPUs
        ray.shutdown()
    start_ray(num_cpus=4)
    yield ray
    ray.shutdown()


def _worker(model_dir: str, world_size: int, zero_stage: int) -> WorkerConfig:
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = True
    cfg.training_args.learning_rate = 1e-4  # Adam moves every weight by ~lr on step 1
    cfg.training_args.per_device_train_batch_size = GLOBAL_BATCH // world_size
    cfg.strategy_args.strategy_name = "deepspeed_train"
    cfg.strategy_args.strategy_config = {"zero_stage": zero_stage}
    cfg.world_size, cfg.num_cpus_per_worker = world_size, 1
    return cfg


def mean_logp_loss(log_probs, entropy, batch):
    """-mean log p over every token (all sequences have the same length, so per-rank means average exactly)."""
    loss = -log_probs.mean()
    return loss, {"loss": float(loss.detach())}


def _start_group(ray, model_dir: str, world_size: int, zero_stage: int) -> tuple[RayWorkerGroup, dict]:
    cfg = _worker(model_dir, world_size, zero_stage)
    plan = plan_placement({"actor_train": cfg}, num_gpus_per_node=0)
    check_feasible(plan, ray.cluster_resources())
    pgs = create_placement_groups(plan, timeout_s=30)
    return RayWorkerGroup("actor_train", cfg, 300, slots=plan.roles["actor_train"], placement_groups=pgs), pgs


def _train_once(ray, group: RayWorkerGroup, pgs: dict, batch: Batch) -> dict[str, torch.Tensor]:
    try:
        group.call("initialize", StrategyContext(seed=3, max_grad_norm=1.0, total_steps=1))
        metrics = group.call_dp("train_step", batch, loss_fn=mean_logp_loss)
        assert len(metrics) == group.world_size
        return dict(ActorProxy(group).weights_out.gather())  # every rank gathers, rank 0's copies
    finally:
        group.shutdown()
        for pg in pgs.values():
            ray.util.remove_placement_group(pg)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [2])
def test_two_workers_match_one(ray_cluster, tiny_model_dir, zero_stage):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 400, (GLOBAL_BATCH, SEQ), generator=gen)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    one_group = _start_group(ray_cluster, tiny_model_dir, 1, zero_stage)
    two_group = _start_group(ray_cluster, tiny_model_dir, 2, zero_stage)  # both start up concurrently
    before = _train_once(ray_cluster, *one_group, batch)
    two = _train_once(ray_cluster, *two_group, batch)
    from transformers import AutoModelForCausalLM

    init = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    moved = max(float((before[n] - init[n].detach()).abs().max()) for n in init)
    assert moved > 5e-5  # the step changed the weights
    diffs = {n: float((two[n] - t).abs().max()) for n, t in before.items()}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-6, (worst, diffs[worst], int(((two[worst] - before[worst]).abs() > 1e-6).sum()))


@pytest.mark.slow
def test_infeasible_request_fails_fast(ray_cluster, tiny_model_dir):
    cfg = _worker(tiny_model_dir, 2, 0)
    cfg.num_cpus_per_worker = 64
    plan = plan_placement({"actor_train": cfg}, num_gpus_per_node=0)
    with pytest.raises(RuntimeError, match=r"128 CPUs .*the cluster has 4"):
        check_feasible(plan, ray_cluster.cluster_resources())


@pytest.mark.slow
def test_placement_group_timeout_names_bundles(ray_cluster):
    from roll.distributed.placement import PlacementPlan

    plan = PlacementPlan(roles={}, bundles={"node0": [{"GPU": 1.0, "CPU": 1.0}]})  # no GPU in this cluster
    with pytest.raises(RuntimeError, match=r"placement group 'node0' with bundles .*GPU.* was not ready"):
        create_placement_groups(plan, timeout_s=1)
