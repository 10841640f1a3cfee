"""The copy-mode weight sync between real Ray actors: the trainer's weights go to the inference worker through the
object store (the driver passes the object ref), and the engine then scores exactly as the trainer does."""

from __future__ import annotations

import torch

from roll.config.worker import WorkerConfig
from roll.data.batch import Batch
from roll.distributed.group import RayWorkerGroup
from roll.distributed.roles import ActorProxy, InferProxy
from roll.distributed.weight_sync import WeightSync
from roll.strategies.base import StrategyContext


def _config(model_dir: str, strategy: str) -> WorkerConfig:
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.strategy_args.strategy_name = strategy
    if strategy == "deepspeed_train":
        cfg.strategy_args.strategy_config = {"zero_stage": 0}
    cfg.num_cpus_per_worker = 1
    return cfg


def test_copy_sync_between_ray_actors(ray_session, tiny_model_dir):
    train = ActorProxy(RayWorkerGroup("actor_train", _config(tiny_model_dir, "deepspeed_train"), 300))
    infer = InferProxy(RayWorkerGroup("actor_infer", _config(tiny_model_dir, "hf_infer"), 300))
    train.initialize(StrategyContext(seed=0))
    infer.initialize(StrategyContext(seed=0))
    ids = torch.randint(10, 400, (4, 12), generator=torch.Generator().manual_seed(0))
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def infer_log_probs() -> torch.Tensor:
        return torch.cat([p["log_probs"] for p in infer.group.call_dp("compute_log_probs", batch)])

    want = train.compute_log_probs(batch)
    infer.load_weights([(n, t + 0.05) for n, t in train.named_weights()])  # the engine now holds other weights
    assert (infer_log_probs() - want).abs().max() > 1e-3
    out = WeightSync(train, infer, "copy")()
    torch.testing.assert_close(infer_log_probs(), want, atol=1e-5, rtol=1e-5)
    assert out["sync/mode"] == 0.0 and out["sync/gib"] > 0 and out["time/sync"] >= out["time/sync_push"] > 0
    assert train.memory_stats() == {} and train._no_cuda  # asked once on CPU; later steps skip the round trip
