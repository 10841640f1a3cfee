"""One rank of an ``fsdp2_train`` / ``fsdp2_infer`` world, run as its own process by ``test_fsdp2.py`` (gloo).

``python fsdp2_peer.py SCENARIO[,SCENARIO...] MODEL_DIR OUT_DIR`` with ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and
``WORLD_SIZE`` set (and ``LOCAL_RANK``, the GPU, when CUDA is visible: ``test_fsdp2_gpu.py`` runs it over NCCL on two
GPUs); rank r takes chunk r of the test batch (``Batch.chunk``, as ``call_dp`` does) and writes what the test
compares, on CPU, to ``OUT_DIR/<scenario>_rank<r>.pt``. Scenarios:

- ``train``: one optimizer step: metrics, the applied gradients (Adam's first moment, gathered), the number of
  reduce-scatters the step made and of its micro-batches;
- ``resume``: step, checkpoint, step; then a fresh strategy loads the checkpoint and steps: the state saved and the
  state loaded (weights, Adam moments), both steps' metrics and weights;
- ``weights``: bucket plan, bucket contents and ``named_weights`` after ``load_weights`` of known tensors, the HF
  export of them (``OUT_DIR/hf``), and a gather/scatter round trip through an unevenly sharded parameter;
- ``infer``: ``fsdp2_infer`` log-probs with unequal micro-batch counts per rank (rank 1 gets no samples at all);
- ``critic``: one critic step (values and the applied gradients);
- ``lora``: one step with LoRA adapters, the adapter and the merged export as gathered on every rank, the base
  model's log-probs, and a checkpoint round trip.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: ``tests`` imports

from roll.algorithms.losses import ActorLossConfig  # noqa: E402
from roll.config.worker import WorkerConfig  # noqa: E402
from roll.ppo.loss_fns import CriticValueLoss, PPOActorLoss  # noqa: E402
from roll.strategies.base import StrategyContext  # noqa: E402
from roll.strategies.registry import build_strategy  # noqa: E402
from tests.strategies.test_train_step import _batch  # noqa: E402

RANK, WORLD = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
#: Sample order of the ``train`` batch: long samples first, so token-budget micro-batches differ in number between
#: the ranks (lengths 11, 12, 9, 8 | 4, 3, 6, 5: 3 and 2 micro-batches on two ranks) and dummy ones pad the shorter.
ORDER = [0, 4, 2, 6, 1, 5, 3, 7]
#: strategy_config of every fsdp2 strategy of the run (JSON; e.g. ``{"fsdp_size": 2}`` for HSDP on 4 ranks)
OPTIONS = json.loads(os.environ.get("FSDP2_OPTIONS", "{}"))


def strategy(
    model_dir: str,
    name: str = "fsdp2_train",
    role: str = "actor_train",
    per_device: int = 2,
    accum: int = 4,
    options: dict | None = None,
    dynamic: bool = False,
    lora: bool = False,
):
    """A strategy of this rank; ``per_device x accum x WORLD`` is the global step; ``lora``: rank-4 adapters on
    every linear layer."""
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = True
    if lora:
        cfg.model_args.lora_target, cfg.model_args.lora_rank, cfg.model_args.lora_alpha = "all-linear", 4, 8
    cfg.strategy_args.strategy_name = name
    cfg.strategy_args.strategy_config = {**OPTIONS, **(options or {})}
    cfg.training_args.per_device_train_batch_size = per_device
    cfg.training_args.gradient_accumulation_steps = accum
    cfg.training_args.learning_rate = 1e-2
    cfg.use_dynamic_batching_in_train = cfg.use_dynamic_batching_in_infer = dynamic
    cfg.max_tokens_per_microbatch_in_train = cfg.max_tokens_per_microbatch_in_infer = 20
    cfg.infer_batch_size = 2
    s = build_strategy(cfg, role, RANK, WORLD)
    s.initialize(StrategyContext(seed=0, max_grad_norm=0.5, total_steps=10))
    return s


def applied_grads(s) -> dict[str, torch.Tensor]:
    """Adam's first moment after one step / (1 - beta1): the clipped gradient, gathered (collective), of every
    parameter the optimizer steps (with LoRA: the adapters)."""
    beta1 = s.config.training_args.adam_beta1
    state = s.optimizer.state
    return {n: state[p]["exp_avg"].full_tensor() / (1 - beta1) for n, p in s.model.named_parameters() if p in state}


def count_reduce_scatters() -> list[int]:
    """Counts calls of the reduce-scatter FSDP2 uses: ``torch.distributed.reduce_scatter_single`` where this
    PyTorch has it (2.13), else ``reduce_scatter_tensor`` (2.11, the GPU machine's)."""
    import torch.distributed as dist

    name = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    calls, original = [0], getattr(dist, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(dist, name, counted)
    return calls


def train(model_dir: str, out: Path) -> dict:
    chunk = _batch().select(ORDER).chunk(WORLD)[RANK]
    s = strategy(model_dir, per_device=2, accum=4 // WORLD, dynamic=True)
    calls = count_reduce_scatters()
    metrics = s.train_step(chunk, PPOActorLoss(ActorLossConfig(loss_agg_mode="token-mean")))
    return {
        "metrics": metrics,
        "grads": applied_grads(s),
        "reduce_scatters": calls[0],
        "units": len(s.model.model.layers) + 1,
        "micro_batches": len(s._micro(chunk, train=True)),
        "mesh": tuple(s.mesh.shape),
    }


def resume(model_dir: str, out: Path) -> dict:
    batches = [_batch(seed=k).chunk(WORLD)[RANK] for k in range(2)]
    loss = PPOActorLoss(ActorLossConfig(loss_agg_mode="seq-mean-token-mean"))
    first = strategy(model_dir, accum=4 // WORLD)
    first.train_step(batches[0], loss)
    saved = snapshot(first)
    first.save_checkpoint(str(out / "ckpt"))
    straight = first.train_step(batches[1], loss)
    second = strategy(model_dir, accum=4 // WORLD)
    second.load_checkpoint(str(out / "ckpt"))
    loaded = snapshot(second)
    resumed = second.train_step(batches[1], loss)
    return {
        "straight": (straight, dict(first.named_weights())),
        "resumed": (resumed, dict(second.named_weights())),
        "steps": (first.optimizer_steps, second.optimizer_steps),
        "saved": saved,
        "loaded": loaded,
    }


def snapshot(s) -> dict[str, torch.Tensor]:
    """Whole weights and Adam moments (gathered: collective) of a training strategy."""
    out = {f"w/{n}": p.full_tensor() for n, p in s.model.named_parameters()}
    for n, p in s.model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{key}/{n}"] = s.optimizer.state[p][key].full_tensor()
    return out


def weights(model_dir: str, out: Path) -> dict:
    from torch.distributed.fsdp import fully_shard

    from roll.strategies.fsdp2_shard import full_tensor, load_full

    s = strategy(model_dir)
    gen = torch.Generator().manual_seed(5)
    new = [(n, torch.randn(p.shape, generator=gen)) for n, p in s.model.named_parameters()]
    s.load_weights(new)
    metas = s.weight_bucket_metas(20000)
    buckets = [[(n, t.clone()) for n, t in b] for b in s.weight_buckets(20000)]
    s.save_pretrained(str(out / "hf"))  # collective; rank 0 writes
    odd = torch.nn.Linear(3, 5)  # weight (5, 3): dim 0 splits 3 + 2 over two ranks
    fully_shard(odd, mesh=s.mesh)
    value = torch.arange(15, dtype=torch.float32, device=s.device).view(5, 3)
    load_full(odd.weight, value)
    return {
        "metas": [m.to_dict() for m in metas],
        "buckets": buckets,
        "named": dict(s.named_weights()),
        "new": dict(new),
        "odd_local": odd.weight.to_local().clone(),
        "odd_full": full_tensor(odd.weight, s.device),
    }


def infer(model_dir: str, out: Path) -> dict:
    batch = _batch()
    mine = batch.select(range(7)) if RANK == 0 else batch.select([])  # 4 micro-batches of 2 against none
    s = strategy(model_dir, name="fsdp2_infer", role="reference")
    return {"log_probs": s.compute_log_probs(mine, with_entropy=True)}


def critic(model_dir: str, out: Path) -> dict:
    batch = _batch()
    batch["values"] = torch.zeros(batch["input_ids"].shape[0], batch["input_ids"].shape[1] - 1)
    batch["returns"] = torch.linspace(-1, 1, batch["values"].numel()).view_as(batch["values"])
    s = strategy(model_dir, role="critic", accum=4 // WORLD)
    metrics = s.train_step(batch.chunk(WORLD)[RANK], CriticValueLoss(0.5))
    return {"metrics": metrics, "grads": applied_grads(s)}


def lora(model_dir: str, out: Path) -> dict:
    """LoRA: one step, then what every rank's gathers give (the adapter, the merged export, its buckets), the base
    log-probs, and a checkpoint round trip (step, save, step == load, step)."""
    loss = PPOActorLoss(ActorLossConfig(loss_agg_mode="token-mean"))
    chunk = _batch().select(ORDER).chunk(WORLD)[RANK]
    s = strategy(model_dir, per_device=2, accum=4 // WORLD, dynamic=True, lora=True)
    metrics = s.train_step(chunk, loss)
    result = {
        "metrics": metrics,
        "grads": applied_grads(s),
        "adapter": dict(s.adapter_weights()),
        "named": dict(s.named_weights()),
        "buckets": [[(n, t.clone()) for n, t in b] for b in s.weight_buckets(20000)],
        "base_log_probs": s.compute_base_log_probs(_batch())["log_probs"],
    }
    s.save_checkpoint(str(out / "lora_ckpt"))
    second = _batch(seed=2).chunk(WORLD)[RANK]
    straight = s.train_step(second, loss)
    resumed = strategy(model_dir, per_device=2, accum=4 // WORLD, dynamic=True, lora=True)
    resumed.load_checkpoint(str(out / "lora_ckpt"))
    result["steps"] = (straight, resumed.train_step(second, loss))
    result["adapters"] = (dict(s.adapter_weights()), dict(resumed.adapter_weights()))
    return result


def to_cpu(value):
    """``value`` with every tensor in it (nested dicts, lists, tuples) copied to CPU (GPU runs)."""
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def main(scenarios: str, model_dir: str, out_dir: str) -> None:
    out = Path(out_dir)
    run = {"train": train, "resume": resume, "weights": weights, "infer": infer, "critic": critic, "lora": lora}
    for scenario in scenarios.split(","):
        result = run[scenario](model_dir, out)
        torch.save(to_cpu(result), out / f"{scenario}_rank{RANK}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
