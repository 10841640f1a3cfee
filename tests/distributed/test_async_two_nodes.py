"""Asynchronous agentic training on a Ray cluster of two nodes (two raylets on loopback, 3 CPUs each, joined with
``ray_address``): actor_train and actor_infer (2 CPUs each) cannot share a node, so they land on different ones,
and an ``async_generation_ratio: 1`` run completes with its staleness bound, its weights crossing nodes through the
object store. A user who outgrows one machine starts the same cluster with ``ray start`` (docs/async.md)."""

from __future__ import annotations

import json

import pytest

from roll.config.loader import load_config


@pytest.fixture
def two_node_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_async_run_with_train_and_infer_on_different_nodes(tiny_model_dir, tmp_path, two_node_cluster):
    import ray

    from roll.pipelines.agentic_pipeline import AgenticPipeline

    overrides = [
        f"pretrain={tiny_model_dir}",
        "tiny_model=null",
        f"output_dir={tmp_path}",
        f"logging_dir={tmp_path}/logs",
        "distributed=ray",
        f"ray_address={two_node_cluster.address}",
        "track_with=stdout",
        "max_steps=3",
        "save_steps=0",
        "eval_steps=0",
        "trajectory_dump_steps=0",
        "sft_warmup.enabled=false",
        "rollout_batch_size=8",
        "sequence_length=256",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=4",
        "val_env_manager=null",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "actor_train.num_cpus_per_worker=2",
        "actor_infer.num_cpus_per_worker=2",
        "custom_envs.SimpleSokoban.max_actions_per_traj=2",
        "actor_infer.generating_args.max_new_tokens=4",
        "custom_envs.SimpleSokoban.max_tokens_per_step=4",
        "zero_signal_patience=0",
        "reward_normalization.grouping=batch",
        "reward_normalization.method=identity",
        "entropy_loss_coef=0.01",
        "async_generation_ratio=1",
    ]
    pipe = AgenticPipeline(load_config("sokoban_tiny", overrides=overrides))
    pipe.run()

    def node_id(worker) -> str:
        return ray.get_runtime_context().get_node_id()

    nodes = {
        role: ray.get(pipe.roles.groups[role].actors[0].__ray_call__.remote(node_id))
        for role in ("actor_train", "actor_infer")
    }
    assert nodes["actor_train"] != nodes["actor_infer"], nodes
    assert len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 2
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    staleness = [r["rollout/staleness_max"] for r in rows if "rollout/staleness_max" in r]
    assert len(staleness) == 3 and max(staleness) <= 1.0 and staleness[0] == 0.0
