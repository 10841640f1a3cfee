"""fsdp2_train / fsdp2_infer on CUDA (skipped without a GPU; run on the GPU machine by ``scripts/verify_gpu_fsdp2.sh``):
bf16 against deepspeed_train on the Qwen2.5-0.5B-shaped model, offload / reload between phases, CPU offload during
training, device weight buckets, the reference; on two GPUs, two NCCL ranks against one. The CPU half is
``test_fsdp2.py``.

The 0.5B model is read from ``$ROLL_GPU_MODEL`` (default ``/tmp/roll-models/qwen05b-rand``, built by
``scripts/build_qwen05b_rand.py``); the tests that need it are skipped when it is absent."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig
from roll.data.batch import Batch
from roll.ppo.loss_fns import PPOActorLoss
from tests.strategies.test_fsdp2 import _build

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; verified on the GPU machine")
MODEL = os.environ.get("ROLL_GPU_MODEL", "/tmp/roll-models/qwen05b-rand")
HERE = Path(__file__).resolve().parent
PPO = PPOActorLoss(ActorLossConfig(loss_agg_mode="token-mean"))


@pytest.fixture(scope="module", autouse=True)
def dist_env():
    from roll.distributed.group import free_port

    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }
    for k, v in env.items():
        os.environ.setdefault(k, v)


@pytest.fixture(scope="module")
def model_dir() -> str:
    if not (Path(MODEL) / "config.json").is_file():
        pytest.skip(f"no model at {MODEL} (python scripts/build_qwen05b_rand.py {MODEL})")
    return MODEL


def _gpu_batch(samples: int = 16, length: int = 512, vocab: int = 151936) -> Batch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab - 10, (samples, length), generator=gen)
    response = torch.ones_like(ids)
    response[:, :64] = 0
    adv = torch.randn(samples, 1, generator=gen).expand(samples, length - 1).clone()
    return Batch(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": response, "advantages": adv}
    )


def _step_record(strategy, batch: Batch) -> dict:
    """Log-probs before the step, the step's metrics, the applied gradients (Adam's first moment) on CPU."""
    log_probs = strategy.compute_log_probs(batch)["log_probs"]
    metrics = strategy.train_step(batch, PPO)
    beta1 = strategy.config.training_args.adam_beta1
    if hasattr(strategy, "engine"):  # deepspeed_train: ZeRO keeps the moments in flat fp32 partitions
        from deepspeed.utils import safe_get_full_optimizer_state

        grads = {
            n: safe_get_full_optimizer_state(p, "exp_avg").float().cpu() / (1 - beta1)
            for n, p in strategy.engine.module.named_parameters()
        }
    else:
        state = strategy.optimizer.state
        grads = {
            n: state[p]["exp_avg"].full_tensor().float().cpu() / (1 - beta1)
            for n, p in strategy.model.named_parameters()
        }
    return {"log_probs": log_probs, "metrics": metrics, "grads": grads}


def _free_cuda() -> None:
    """Return the memory of strategies the caller has deleted."""
    gc.collect()
    torch.cuda.empty_cache()


def test_bf16_step_matches_deepspeed(model_dir):
    """Same bf16 weights, batch and micro-batches: log-probs, loss, pre-clip norm and applied gradients of
    fsdp2_train (fp32 master shards, bf16 compute) agree with deepspeed_train ZeRO-2 bf16 within bf16 noise."""
    batch = _gpu_batch()
    kwargs = dict(dtype="bf16", per_device=4, accum=4)
    ds = _build(model_dir, "deepspeed_train", {"zero_stage": 2}, **kwargs)
    want = _step_record(ds, batch)
    del ds
    _free_cuda()
    fs = _build(model_dir, "fsdp2_train", {}, **kwargs)
    got = _step_record(fs, batch)
    lp_diff = (got["log_probs"] - want["log_probs"]).abs()
    print(
        f"log-prob |diff| mean {float(lp_diff.mean()):.2e} max {float(lp_diff.max()):.2e}; grad_norm fsdp2 "
        f"{got['metrics']['actor/grad_norm']:.6g} deepspeed {want['metrics']['actor/grad_norm']:.6g}"
    )
    assert float(lp_diff.mean()) < 2e-3 and float(lp_diff.max()) < 0.1
    assert got["metrics"]["actor/pg_loss"] == pytest.approx(want["metrics"]["actor/pg_loss"], rel=1e-2, abs=1e-4)
    assert want["metrics"]["actor/grad_norm"] > 0  # two zero norms would be "equal"
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(want["metrics"]["actor/grad_norm"], rel=2e-2)
    num = sum(float((got["grads"][n] - g).pow(2).sum()) for n, g in want["grads"].items())
    den = sum(float(g.pow(2).sum()) for g in want["grads"].values())
    print(f"applied gradients: relative L2 difference {(num / den) ** 0.5:.2e}")
    assert (num / den) ** 0.5 < 3e-2
    del fs
    _free_cuda()


def test_offload_reload_between_phases(model_dir):
    """offload_states frees the shards and Adam states from the GPU; reload_states brings back the same values."""
    fs = _build(model_dir, "fsdp2_train", {}, dtype="bf16", per_device=4, accum=1)
    fs.train_step(_gpu_batch(4, 256), PPO)
    before = {n: t.clone() for n, t in fs.named_weights()}
    allocated = torch.cuda.memory_allocated()
    fs.offload_states()
    freed = allocated - torch.cuda.memory_allocated()
    params = sum(p.numel() for p in fs.model.parameters())
    print(f"offload freed {freed / 2**30:.2f} GiB of {allocated / 2**30:.2f} GiB ({params} parameters)")
    assert freed >= 0.9 * params * 12  # fp32 shards + two fp32 Adam moments
    fs.reload_states()
    assert all(p.to_local().is_cuda for p in fs.model.parameters())
    for name, tensor in fs.named_weights():
        assert torch.equal(tensor, before[name]), name
    metrics = fs.train_step(_gpu_batch(4, 256), PPO)
    assert metrics["actor/grad_norm"] > 0
    after = dict(fs.named_weights())
    assert any(not torch.equal(after[n], t) for n, t in before.items())  # the optimizer moved the reloaded shards
    del fs
    _free_cuda()


def test_cpu_offload_policy_trains_on_gpu(model_dir):
    """offload_policy: the shards stay in CPU memory, units are computed on the GPU, the norm is that of the
    on-GPU strategy."""
    batch = _gpu_batch(4, 256)
    plain = _build(model_dir, "fsdp2_train", {}, dtype="bf16", per_device=4, accum=1)
    want = plain.train_step(batch, PPO)
    del plain
    _free_cuda()
    off = _build(model_dir, "fsdp2_train", {"offload_policy": True}, dtype="bf16", per_device=4, accum=1)
    assert all(p.to_local().device.type == "cpu" for p in off.model.parameters())
    got = off.train_step(batch, PPO)
    assert want["actor/grad_norm"] > 0  # two zero norms would be "equal"
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-2)
    del off
    _free_cuda()


def test_device_buckets_and_reference(model_dir):
    """Weight buckets are bf16 tensors on the GPU (what CUDA IPC shares), equal to named_weights; fsdp2_infer loaded
    with them scores like the trainer."""
    fs = _build(model_dir, "fsdp2_train", {}, dtype="bf16", per_device=4, accum=1)
    batch = _gpu_batch(4, 256)
    fs.train_step(batch, PPO)
    named = dict(fs.named_weights())
    for bucket in fs.weight_buckets(256 * 2**20):
        for name, tensor in bucket:
            assert tensor.is_cuda and tensor.dtype == torch.bfloat16
            assert torch.equal(tensor.cpu(), named[name]), name
    ref = _build(model_dir, "fsdp2_infer", {}, role="reference", dtype="bf16")
    ref.load_weights(named.items())
    diff = (ref.compute_log_probs(batch)["log_probs"] - fs.compute_log_probs(batch)["log_probs"]).abs()
    assert float(diff.max()) < 1e-2  # both forwards are bf16 on the same bf16 weights


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_match_one(tiny_model_dir, tmp_path):
    """fsdp2_peer.py's train / resume / weights scenarios on two GPUs (NCCL) against one GPU (fp32 tiny model)."""
    from roll.distributed.group import free_port
    from tests.strategies.test_fsdp2 import _fsdp2, _fsdp2_grads
    from tests.strategies.test_train_step import _batch

    port, procs = free_port(), []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "fsdp2_peer.py"), "train,resume,weights", tiny_model_dir, str(tmp_path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
    from tests.strategies.fsdp2_peer import ORDER

    one = _fsdp2(tiny_model_dir, dynamic=True)
    want = one.train_step(_batch().select(ORDER), PPO)
    want_grads = {n: g.cpu() for n, g in _fsdp2_grads(one).items()}
    for rank in range(2):
        got = torch.load(tmp_path / f"train_rank{rank}.pt", weights_only=False)
        assert want["actor/grad_norm"] > 0  # two zero norms would be "equal"
        assert got["metrics"]["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)
        for name, grad in want_grads.items():
            torch.testing.assert_close(got["grads"][name], grad, atol=1e-5, rtol=1e-3, msg=name)
        resumed = torch.load(tmp_path / f"resume_rank{rank}.pt", weights_only=False)
        assert resumed["steps"] == (2, 2)
        for name, tensor in resumed["saved"].items():  # exact: no kernel between save and load
            assert torch.equal(resumed["loaded"][name], tensor), name
        # the next step is only equal to float noise on CUDA (atomics), which Adam can blow up to ~lr for near-zero
        # gradients: compare its metrics, not the weights it writes
        assert resumed["resumed"][0] == pytest.approx(resumed["straight"][0], rel=1e-4, abs=1e-6)
        weights = torch.load(tmp_path / f"weights_rank{rank}.pt", weights_only=False)
        for bucket in weights["buckets"]:
            for name, tensor in bucket:
                assert torch.equal(tensor, weights["new"][name]), name
