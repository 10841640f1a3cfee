"""The copy-mode weight sync between real Ray actors, through the object store (the driver passes the object ref)
and through a shared-memory file, driven through the role proxies' weight faces (the endpoint methods travel to the
actors by reference): the engine then scores exactly as the trainer does."""

from __future__ import annotations

from collections.abc import Iterator

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


@pytest.fixture(scope="class")
def roles(ray_session, tiny_model_dir) -> Iterator[tuple[ActorProxy, InferProxy]]:
    """A DeepSpeed trainer and an hf_infer engine, each a Ray actor (started once: each case first gives the engine
    other weights); shut down after the class's last case, since they hold the Ray session's 2 CPUs (the module's
    next test would wait for a CPU that never frees)."""
    train = ActorProxy(RayWorkerGroup("actor_train", _config(tiny_model_dir, "deepspeed_train"), 300))
    infer = InferProxy(RayWorkerGroup("actor_infer", _config(tiny_model_dir, "hf_infer"), 300))
    train.initialize(StrategyContext(seed=0))
    infer.initialize(StrategyContext(seed=0))
    yield train, infer
    train.group.shutdown()
    infer.group.shutdown()


@pytest.mark.slow
class TestCopySync:
    @pytest.mark.parametrize("shared", [False, True])
    def test_copy_sync_between_ray_actors(self, roles, tmp_path, shared):
        train, infer = roles
        ids = torch.randint(10, 400, (4, 12), generator=torch.Generator().manual_seed(0))
        batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

        def infer_log_probs() -> torch.Tensor:
            return torch.cat([p["log_probs"] for p in infer.group.call_dp("compute_log_probs", batch)])

        want = train.compute_log_probs(batch)
        infer.weights_in.load([(n, t + 0.05) for n, t in train.weights_out.gather()])  # the engine holds other weights
        assert (infer_log_probs() - want).abs().max() > 1e-3
        assert train.weights_out.passes_refs  # Ray: rank 0's gathered weights go to the engine by object ref
        out = WeightSync(train.weights_out, infer.weights_in, "copy", shared_dir=str(tmp_path) if shared else None)()
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


@pytest.mark.slow
def test_adapter_sync_between_ray_actors(ray_session, tiny_model_dir, request):
    """LoRA: only the adapter travels (object ref from trainer rank 0 to the engine actor), the engine serves it on
    its own base and then scores exactly as the trainer does; ``sync/gib`` is the adapter's size. Fails when the
    adapter does not arrive (the engine scores as the base), when the full weights travel (the size), or when a
    stale adapter is kept (the second sync)."""
    cfgs = [_config(tiny_model_dir, s) for s in ("deepspeed_train", "hf_infer")]
    for cfg in cfgs:
        cfg.model_args.lora_target, cfg.model_args.lora_rank = "all-linear", 4
    train = ActorProxy(RayWorkerGroup("actor_train", cfgs[0], 300))
    infer = InferProxy(RayWorkerGroup("actor_infer", cfgs[1], 300))
    request.addfinalizer(train.group.shutdown)  # free the session's CPUs for the module's later tests
    request.addfinalizer(infer.group.shutdown)
    train.initialize(StrategyContext(seed=0))
    infer.initialize(StrategyContext(seed=0))
    ids = torch.randint(10, 400, (4, 12), generator=torch.Generator().manual_seed(0))
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def infer_log_probs() -> torch.Tensor:
        return torch.cat([p["log_probs"] for p in infer.group.call_dp("compute_log_probs", batch)])

    base = infer_log_probs()
    sync = WeightSync(train.weights_out, infer.weights_in, "adapter")
    from roll.ppo.loss_fns import SFT_LOSS

    sft = Batch({**{k: batch[k] for k in ("input_ids", "attention_mask")}, "response_mask": torch.ones_like(ids)})
    for lr in (1e-2, 3e-2):  # move the adapters away from zero (B = 0 at start: the actor is the base)
        train.train_step(sft, SFT_LOSS, lr=lr)
        want = train.compute_log_probs(batch)
        assert (want - base).abs().max() > 1e-3
        out = sync()
        torch.testing.assert_close(infer_log_probs(), want, atol=1e-5, rtol=1e-5)
    tensors, config = train.weights_out.adapter()
    assert all(".lora_" in name for name, _ in tensors) and config["r"] == 4
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    assert out["sync/mode"] == 4.0 and out["sync/gib"] == pytest.approx(nbytes / 2**30)
