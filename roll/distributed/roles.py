"""Typed proxies of the roles: what a pipeline may ask of ``actor_train``, ``actor_infer``, ``reference`` and
``critic``, as methods with signatures (an IDE and a type checker follow them to :class:`~roll.distributed.worker.
Worker` and on to the strategy).

A proxy wraps the role's :class:`~roll.distributed.group.WorkerGroup` and says how each call spreads over the ranks:
``*_dp`` calls split a batch into one chunk per rank and concatenate the results; the others run on every rank (or
rank 0). :meth:`Roles.of` builds the proxies once at start and checks there, against the strategy registry, that
each role's strategy serves it; what a strategy can do beyond its role (``submit``, ``weight_group``,
``ipc_weights``) is read from its registry entry (:attr:`RoleProxy.spec`), never discovered at call time.

Weights have one face per direction (:mod:`roll.distributed.weight_faces`): every role takes weights in
(:attr:`RoleProxy.weights_in`), a training role also sends them (:attr:`TrainProxy.weights_out`); the weight sync
(:mod:`roll.weights.sync`) drives the two.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from roll.config.worker import GeneratingArgs
from roll.data.batch import Batch
from roll.distributed.group import WorkerGroup
from roll.distributed.weight_faces import WeightsIn, WeightsOut
from roll.distributed.worker import Worker
from roll.strategies.base import GenerationOutput, LossFn, StrategyContext
from roll.strategies.registry import StrategySpec, strategy_spec


class RoleProxy:
    """Calls every role answers: start, memory, RNG states, and weights in (:attr:`weights_in`)."""

    def __init__(self, group: WorkerGroup, spec: StrategySpec | None = None):
        self.group, self.spec = group, spec
        self.weights_in = WeightsIn(group)  # weights into every worker of the role (the sync's receiver)
        self._no_cuda = False  # rank 0 answered memory_stats with {}: it has no CUDA, and never will

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def initialize(self, ctx: StrategyContext) -> list[float]:
        """Build every rank's strategy; seconds per rank."""
        return self.group.call(Worker.initialize, ctx)

    def memory_stats(self) -> dict[str, float]:
        """Rank 0's CUDA memory in GiB (``{}`` on CPU: asked once, then known, which saves a round trip per step)."""
        if self._no_cuda:
            return {}
        stats = self.group.call_rank0(Worker.memory_stats)
        self._no_cuda = not stats
        return stats

    def rng_states(self) -> list[dict[str, Any]]:
        """Every rank's RNG states, in rank order."""
        return self.group.call(Worker.rng_state)

    def set_rng_states(self, states: list[dict[str, Any]]) -> None:
        """Restore :meth:`rng_states` (one per rank)."""
        self.group.call_each(Worker.set_rng_state, [(s,) for s in states])


class ScorerProxy(RoleProxy):
    """A role that scores sequences (``reference``; also every training role)."""

    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        """(B, L-1) log-probs of ``batch``, data parallel (log-prob frame of :mod:`roll.data.layout`)."""
        return torch.cat([part["log_probs"] for part in self.group.call_dp(Worker.compute_log_probs, batch)])


class TrainProxy(RoleProxy):
    """A training role: optimizer steps, checkpoints, export, and weights out (:attr:`weights_out`)."""

    def __init__(self, group: WorkerGroup, spec: StrategySpec | None = None):
        super().__init__(group, spec)
        self.weights_out = WeightsOut(group)  # the role's weights going out (the sync's sender)

    def train_step(
        self,
        batch: Batch,
        loss_fn: LossFn,
        *,
        lr: float | None = None,
        with_entropy: bool = False,
        return_log_probs: bool = False,
    ) -> list[dict[str, Any]]:
        """One ``train_step`` per rank on its chunk of ``batch``; each rank's metrics (and ``log_probs`` when asked),
        in rank order (rank chunks are consecutive rows of ``batch``)."""
        return self.group.call_dp(
            Worker.train_step,
            batch,
            loss_fn=loss_fn,
            lr=lr,
            with_entropy=with_entropy,
            return_log_probs=return_log_probs,
        )

    def reset_optimizer(self) -> None:
        """Forget the optimizer's moments on every rank (a new training phase starts)."""
        self.group.call(Worker.reset_optimizer)

    def save_pretrained(self, path: str) -> None:
        """Export the model in Hugging Face format (every rank takes part in gathering; rank 0 writes)."""
        self.group.call(Worker.save_pretrained, path)

    def save_checkpoint(self, path: str) -> None:
        """Every rank writes its shard of model, optimizer and scheduler states."""
        self.group.call(Worker.save_checkpoint, path)

    def load_checkpoint(self, path: str) -> None:
        """Every rank restores what :meth:`save_checkpoint` wrote."""
        self.group.call(Worker.load_checkpoint, path)


class ActorProxy(TrainProxy, ScorerProxy):
    """``actor_train``: trains, and scores sequences (old log-probs; with LoRA, the reference's too)."""

    def compute_base_log_probs(self, batch: Batch) -> torch.Tensor:
        """(B, L-1) log-probs of the base model (the LoRA adapters off), data parallel: the reference log-probs of
        a LoRA run without a reference worker."""
        return torch.cat([part["log_probs"] for part in self.group.call_dp(Worker.compute_base_log_probs, batch)])


class CriticProxy(TrainProxy):
    """The ``critic``: a training role with a value head; ``train_step``'s loss gets values for log-probs."""

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """(B, L-1) values of ``batch``, data parallel."""
        return torch.cat([part["values"] for part in self.group.call_dp(Worker.compute_values, batch)])


class InferProxy(RoleProxy):
    """``actor_infer``: generation, as whole batches (:meth:`generate`) or, when the strategy declares ``submit``,
    as single requests routed to chosen ranks (:meth:`submit`, :meth:`poll`, :meth:`abort`)."""

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        """``prompts`` split into one consecutive chunk per rank, generated concurrently; outputs in prompt order."""
        n = self.world_size
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        chunks = [prompts[bounds[i] : bounds[i + 1]] for i in range(n)]
        results = self.group.call_each(Worker.generate, [(c, args, max_new_tokens) for c in chunks])
        return [out for part in results for out in part]

    def submit(
        self, by_rank: dict[int, list[tuple[str, list[int]]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> None:
        """Queue ``(rid, prompt ids)`` requests on the ranks named, concurrently."""
        self._each(Worker.submit, {r: (reqs, args, max_new_tokens) for r, reqs in by_rank.items()})

    def poll(self, by_rank: dict[int, list[str]], timeout: float) -> dict[str, GenerationOutput]:
        """Finished requests among each rank's ``rids`` (each rank waits up to ``timeout`` s for its first)."""
        done: dict[str, GenerationOutput] = {}
        for part in self._each(Worker.poll, {r: (rids, timeout) for r, rids in by_rank.items()}).values():
            done.update(part)
        return done

    def abort(self, by_rank: dict[int, list[str]]) -> None:
        """Abort requests still in flight on the ranks named."""
        self._each(Worker.abort, {r: (rids,) for r, rids in by_rank.items()})

    def set_policy_version(self, version: int) -> None:
        """Every worker labels the outputs it starts from now on with ``version`` (after a weight sync)."""
        self.group.call(Worker.set_policy_version, version)

    def _each(self, method: Any, per_rank_args: dict[int, tuple]) -> dict[int, Any]:
        if not per_rank_args:
            return {}
        return dict(zip(per_rank_args, self.group.wait(self.group.call_each_async(method, per_rank_args))))


#: The proxy class of each role.
PROXIES: dict[str, type[RoleProxy]] = {
    "actor_train": ActorProxy,
    "actor_infer": InferProxy,
    "reference": ScorerProxy,
    "critic": CriticProxy,
}


@dataclass
class Roles:
    """The run's roles behind their typed proxies (``reference`` / ``critic`` only when configured)."""

    actor_train: ActorProxy
    actor_infer: InferProxy
    reference: ScorerProxy | None = None
    critic: CriticProxy | None = None

    @classmethod
    def of(cls, groups: dict[str, WorkerGroup], cfg: Any) -> Roles:
        """Proxies over started worker groups; each role's strategy must serve that role (checked once, here)."""
        proxies = {}
        for role, group in groups.items():
            spec = strategy_spec(getattr(cfg, role).strategy_args.strategy_name)
            if role not in spec.roles:
                raise TypeError(
                    f"{role}: strategy {spec.name!r} does not serve this role (it serves {sorted(spec.roles)})"
                )
            proxies[role] = PROXIES[role](group, spec)
        return cls(**proxies)

    def items(self) -> Iterator[tuple[str, RoleProxy]]:
        """``(role, proxy)`` of every configured role."""
        for role in PROXIES:
            proxy = getattr(self, role)
            if proxy is not None:
                yield role, proxy

    @property
    def groups(self) -> dict[str, WorkerGroup]:
        """The worker groups by role (for placement-level code: colocation phases, weight sync)."""
        return {role: proxy.group for role, proxy in self.items()}
