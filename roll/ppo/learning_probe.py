"""Does a training backend learn? One PPO step on a fixed batch through the pipeline's own loss, measured.

The question "is this backend actually training my model?" has a measured answer: :func:`probe_actor` runs what a
pipeline step does to ``actor_train`` (an offload / reload cycle as between colocated phases, then ``train_step``
with :class:`~roll.ppo.loss_fns.PPOActorLoss` built from the config's PPO keys) on a batch whose advantages
are non-zero, and reports

- ``grad_norm``: the pre-clip gradient norm the backend logged (0 for a backend whose gradients never arrive);
- ``loss_before`` / ``loss_after``: the same PPO loss on the same batch and old log-probs, from the backend's own
  log-probs before and after the step (a step that did not apply its update leaves them equal);
- ``update``: the fp32 update of every exported (Hugging Face named) weight, ``after - before``, so that two backends'
  updates can be compared by :func:`update_cosine` (a no-op has norm 0 and cosine 0 with any real update).

:func:`probe_critic` does the same for a critic with the value loss. Used by the CPU tests
(``tests/strategies/test_backends_learn.py``) and the GPU checks (``tests/megatron/test_megatron_gpu.py``,
``tests/strategies/test_fsdp2_gpu.py``); :func:`check_learned` names what a probe shows broken.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from roll.algorithms.losses import ActorLossConfig
from roll.data.batch import Batch
from roll.ppo.loss_fns import CriticValueLoss, PPOActorLoss


@dataclass
class ProbeResult:
    """What one probed step did (see the module docstring)."""

    grad_norm: float
    loss_before: float
    loss_after: float
    update: dict[str, torch.Tensor] = field(repr=False)
    metrics: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def update_norm(self) -> float:
        """L2 norm of the whole update vector."""
        return float(torch.sqrt(sum(d.double().square().sum() for d in self.update.values())))


def probe_batch(vocab_size: int, samples: int = 8, width: int = 24, prompt: int = 4, seed: int = 0) -> Batch:
    """A fixed right-padded batch: random token ids below ``vocab_size``, ``prompt`` prompt tokens then a response
    of varying length, and advantages of +1 / -1 per sample (half each: never all zero)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (samples, width), generator=gen)
    lengths = torch.randint(prompt + 2, width + 1, (samples,), generator=gen)
    lengths[0] = width
    positions = torch.arange(width)[None]
    attention = (positions < lengths[:, None]).long()
    response = attention * (positions >= prompt).long()
    ids = ids * attention
    sign = torch.tensor([1.0, -1.0]).repeat((samples + 1) // 2)[:samples]
    advantages = sign[:, None].expand(samples, width - 1).contiguous()
    return Batch({"input_ids": ids, "attention_mask": attention, "response_mask": response, "advantages": advantages})


def _weights(strategy) -> dict[str, torch.Tensor]:
    return {name: t.detach().float().cpu().clone() for name, t in strategy.named_weights()}


def _update(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: after[name] - before[name] for name in before} if after else {}


def probe_actor(
    strategy, batch: Batch, loss_cfg: ActorLossConfig | None = None, offload_cycle: bool = True
) -> ProbeResult:
    """One PPO step of an initialized training ``strategy`` on ``batch`` (see the module docstring). Every rank of
    a multi-rank role calls it; results are complete on the rank that exports weights (rank 0)."""
    batch = batch.to("cpu")  # a copy: the probe adds keys
    batch["old_log_probs"] = _everywhere(strategy.compute_log_probs(batch)["log_probs"], len(batch))
    return _step(
        strategy,
        batch,
        PPOActorLoss(loss_cfg or ActorLossConfig()),
        "old_log_probs",
        lambda: strategy.compute_log_probs(batch)["log_probs"],
        offload_cycle,
        with_entropy=True,
    )


def probe_critic(strategy, batch: Batch, value_clip: float | None = None) -> ProbeResult:
    """One value-loss step of an initialized critic ``strategy`` on ``batch`` (targets: ``returns`` = the
    advantages), measured like :func:`probe_actor`."""
    batch = batch.to("cpu")  # a copy: the probe adds keys
    batch["returns"] = batch["advantages"]
    batch["values"] = _everywhere(strategy.compute_values(batch)["values"], len(batch))
    return _step(
        strategy,
        batch,
        CriticValueLoss(value_clip),
        "values",
        lambda: strategy.compute_values(batch)["values"],
        offload_cycle=True,
    )


def _step(
    strategy, batch: Batch, loss_fn, before_key: str, outputs_after, offload_cycle: bool, **train_kwargs
) -> ProbeResult:
    """The measured step: weights before, the offload / reload cycle, ``train_step``, the loss on ``batch`` from
    ``batch[before_key]`` and from ``outputs_after()``, weights after."""
    before = _weights(strategy)
    if offload_cycle:
        strategy.offload_states()
        strategy.reload_states()
    metrics = strategy.train_step(batch, loss_fn, **train_kwargs)
    after_outputs = outputs_after()
    after = _weights(strategy)
    return ProbeResult(
        grad_norm=_grad_norm(metrics),
        loss_before=_loss(loss_fn, batch, batch[before_key]),
        loss_after=_loss(loss_fn, batch, after_outputs),
        update=_update(before, after),
        metrics=dict(metrics),
    )


def _everywhere(outputs: torch.Tensor, samples: int) -> torch.Tensor:
    """Per-sample outputs on every rank: a role whose non-collector ranks return none (tensor parallelism) gets
    the collector's copy."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return outputs
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, outputs.shape[0] == samples)
    box = [outputs if outputs.shape[0] == samples else None]
    dist.broadcast_object_list(box, src=ranks.index(True))
    return box[0]


def _grad_norm(metrics: dict[str, float]) -> float:
    """The ``<role>/grad_norm`` a train step logged."""
    return float(next(v for k, v in metrics.items() if k.endswith("/grad_norm")))


def _loss(loss_fn, batch: Batch, outputs: torch.Tensor) -> float:
    """The loss function on the whole batch from given per-token outputs (log-probs or values), on CPU."""
    if outputs.shape[0] != len(batch):  # a rank that returns no results (not the collector)
        return float("nan")
    loss, _ = loss_fn(outputs.float(), None, batch)
    return float(loss)


def update_cosine(a: ProbeResult, b: ProbeResult) -> float:
    """Cosine of two probes' whole update vectors (the same weight names); 0 when either is a no-op."""
    if sorted(a.update) != sorted(b.update):
        raise ValueError("the two probes exported different weight names")
    dot = sum(float((a.update[n].double() * b.update[n].double()).sum()) for n in a.update)
    norms = a.update_norm * b.update_norm
    return dot / norms if norms > 0 else 0.0


def check_learned(result: ProbeResult, name: str = "backend") -> list[str]:
    """Problems a probe shows (empty when the step learned): no gradient, no update, a loss that did not go down."""
    problems = []
    if not result.grad_norm > 0:
        problems.append(f"{name}: grad_norm {result.grad_norm} (no gradient reached the optimizer)")
    if not result.update_norm > 0:
        problems.append(f"{name}: the weights did not change")
    if not result.loss_after < result.loss_before:
        problems.append(
            f"{name}: the loss on the same batch did not go down ({result.loss_before:.6g} -> {result.loss_after:.6g})"
        )
    return problems
