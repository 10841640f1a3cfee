"""The copy-mode weight sync between real Ray actors, through the object store (the driver passes the object ref)
and through a shared-memory file: the engine then scores exactly as the trainer does."""

from __future__ import annotations

import pytest
import torch

from roll.config.worker import WorkerConfig
from roll.data.batch import Batch
from roll.distributed.group import RayWorkerGroup
from roll.distributed.roles import ActorProxy, InferProxy
from roll.strategies.base import StrategyContext
from roll.weights.sync import WeightSync


def _config(model_dir: str, strategy: str) -> WorkerConfig:
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.strategy_args.strategy_name = strategy
    if strategy == "deepspeed_train":
        cfg.strategy_args.strategy_config = {"zero_stage": 0}
    cfg.num_cpus_per_worker = 1
    return cfg


@pytest.fixture(scope="module")
def roles(ray_session, tiny_model_dir) -> tuple[ActorProxy, InferProxy]:
    """A DeepSpeed trainer and an hf_infer engine, each a Ray actor (started once: each case first gives the engine
    other weights)."""
    train = ActorProxy(RayWorkerGroup("actor_train", _config(tiny_model_dir, "deepspeed_train"), 300))
    infer = InferProxy(RayWorkerGroup("actor_infer", _config(tiny_model_dir, "hf_infer"), 300))
    train.initialize(StrategyContext(seed=0))
    infer.initialize(StrategyContext(seed=0))
    return train, infer


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True])
def test_copy_sync_between_ray_actors(roles, tmp_path, shared):
    train, infer = roles
    ids = torch.randint(10, 400, (4, 12), generator=torch.Generator().manual_seed(0))
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def infer_log_probs() -> torch.Tensor:
        return torch.cat([p["log_probs"] for p in infer.group.call_dp("compute_log_probs", batch)])

    want = train.compute_log_probs(batch)
    infer.load_weights([(n, t + 0.05) for n, t in train.named_weights()])  # the engine now holds other weights
    assert (infer_log_probs() - want).abs().max() > 1e-3
    out = WeightSync(train, infer, "copy", shared_dir=str(tmp_path) if shared else None)()
    torch.testing.assert_close(infer_log_probs(), want, atol=1e-5, rtol=1e-5)
    assert out["sync/mode"] == 0.0 and out["sync/gib"] > 0 and out["time/sync"] >= out["time/sync_push"] > 0
    assert list(tmp_path.iterdir()) == []  # the shared file is removed after the load
    assert train.memory_stats() == {} and train._no_cuda  # asked once on CPU; later steps skip the round trip


def test_shared_file_round_trip_keeps_names_dtypes_and_values(tmp_path):
    from roll.weights.shared_memory import ALIGN, read_shared, write_shared

    named = [
        ("a", torch.randn(3, 5)),
        ("b", torch.randn(7).to(torch.bfloat16)),
        ("c", torch.arange(5)),
        ("empty", torch.zeros(0)),
    ]
    layout = write_shared(str(tmp_path / "w"), named)
    assert [entry[3] for entry in layout] == [0, ALIGN, 2 * ALIGN, 3 * ALIGN]  # 60, 14 and 40 bytes, aligned
    got = read_shared(str(tmp_path / "w"), layout)
    assert [n for n, _ in got] == ["a", "b", "c", "empty"]
    for (_, want), (_, t) in zip(named, got):
        assert t.dtype == want.dtype and torch.equal(t, want)
