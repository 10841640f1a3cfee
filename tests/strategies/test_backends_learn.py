"""Every training backend learns: one PPO step through the pipeline's loss on a fixed batch with non-zero
advantages (:mod:`roll.ppo.learning_probe`), on CPU.

Per backend (deepspeed_train ZeRO 0-3, fsdp2_train, megatron_train TP=1 and TP=2 through the gloo shim, and the
critic on deepspeed_train and megatron_train): the gradient norm is > 0, the weights move, and the same loss on the
same batch goes down. Across backends (fp32, the same tiny model and batch): the gradient norms agree within 1e-3
relative and the update vectors have cosine >= 0.99. Why a no-op cannot pass: a backend whose gradient never reaches
its optimizer logs grad norm 0 and leaves its weights unchanged (update norm 0, cosine 0 with any real update), and
its loss after the step equals the loss before, which fails the strict ``<``.
"""

from __future__ import annotations

import pytest
import torch

from tests.megatron.mcore_cpu import run_ranks

LR = 1e-3
GRAD_RTOL = 1e-3
COSINE_MIN = 0.99


def _probe(rank: int, model_dir: str, strategy: str, role: str, options: dict) -> dict:
    from roll.config.worker import WorkerConfig
    from roll.ppo.learning_probe import probe_actor, probe_batch, probe_critic
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.training_args.learning_rate = LR
    cfg.training_args.per_device_train_batch_size = 2
    cfg.training_args.gradient_accumulation_steps = 4  # the probe's 8 samples are one optimizer step
    cfg.infer_batch_size = 4
    cfg.strategy_args.strategy_name, cfg.strategy_args.strategy_config = strategy, dict(options)
    import os

    world = int(os.environ["WORLD_SIZE"])
    s = build_strategy(cfg, role, rank, world)
    s.initialize(StrategyContext(seed=1, max_grad_norm=1.0, total_steps=4))
    batch = probe_batch(vocab_size=500, samples=8)  # every rank of a TP group sees the whole batch
    result = probe_critic(s, batch) if role == "critic" else probe_actor(s, batch)
    return result if rank == 0 else None


def _run(model_dir, strategy, options, role="actor_train", world=1):
    shim = strategy.startswith("megatron")
    if shim:
        pytest.importorskip("megatron.core")
    return run_ranks(_probe, world, model_dir, strategy, role, options, shim=shim, timeout=600)[0]


ACTORS = {
    "zero0": ("deepspeed_train", {"zero_stage": 0}, 1),
    "zero1": ("deepspeed_train", {"zero_stage": 1}, 1),
    "zero2": ("deepspeed_train", {"zero_stage": 2}, 1),
    "zero3": ("deepspeed_train", {"zero_stage": 3}, 1),
    "fsdp2": ("fsdp2_train", {}, 1),
    "megatron_tp1": ("megatron_train", {"tensor_model_parallel_size": 1}, 1),
    "megatron_tp2": ("megatron_train", {"tensor_model_parallel_size": 2}, 2),
}


@pytest.fixture(scope="module")
def actors(tiny_model_dir):
    return {
        name: _run(tiny_model_dir, strategy, options, world=world)
        for name, (strategy, options, world) in ACTORS.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ACTORS))
def test_actor_backend_learns(actors, name):
    from roll.ppo.learning_probe import check_learned

    result = actors[name]
    print(
        f"[learn] {name}: grad_norm {result.grad_norm:.6f} loss {result.loss_before:.6f} -> "
        f"{result.loss_after:.6f} update norm {result.update_norm:.4e}"
    )
    assert check_learned(result, name) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ACTORS if n != "zero0"])
def test_actor_backends_agree(actors, name):
    """Each backend's gradient norm and update against ZeRO-0 (a plain full-model copy)."""
    from roll.ppo.learning_probe import update_cosine

    ref, result = actors["zero0"], actors[name]
    assert result.grad_norm == pytest.approx(ref.grad_norm, rel=GRAD_RTOL)
    cosine = update_cosine(ref, result)
    print(f"[learn] {name} vs zero0: grad norm {result.grad_norm:.6f} / {ref.grad_norm:.6f}, cosine {cosine:.6f}")
    assert cosine >= COSINE_MIN


@pytest.mark.slow
def test_critic_backends_learn_and_agree(tiny_model_dir):
    from roll.ppo.learning_probe import check_learned, update_cosine

    ds = _run(tiny_model_dir, "deepspeed_train", {"zero_stage": 2}, role="critic")
    mg = _run(tiny_model_dir, "megatron_train", {"tensor_model_parallel_size": 1}, role="critic")
    assert check_learned(ds, "deepspeed critic") == [] and check_learned(mg, "megatron critic") == []
    assert mg.grad_norm == pytest.approx(ds.grad_norm, rel=GRAD_RTOL)
    assert update_cosine(ds, mg) >= COSINE_MIN


def test_a_skipped_update_fails_the_checks():
    """The checks themselves: a probe of a step that applied nothing fails all three, and has cosine 0."""
    from roll.ppo.learning_probe import ProbeResult, check_learned, update_cosine

    still = ProbeResult(grad_norm=0.0, loss_before=0.5, loss_after=0.5, update={"w": torch.zeros(3)})
    moved = ProbeResult(grad_norm=1.0, loss_before=0.5, loss_after=0.4, update={"w": torch.ones(3)})
    assert len(check_learned(still)) == 3 and check_learned(moved) == []
    assert update_cosine(still, moved) == 0.0
    assert update_cosine(moved, moved) == pytest.approx(1.0)
