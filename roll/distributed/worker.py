"""A worker: one rank of one role, holding one strategy. Runs as a Ray actor or in-process (local mode).

What the strategy must implement is its registry entry's contract (:mod:`roll.strategies.registry`): the base
class of its role and the Protocols of its declared abilities, checked when the class is resolved. The forwarders
below call the strategy's declared methods directly; an ability is read from the entry, never probed. The strategy
gets its typed options (:func:`roll.strategies.registry.strategy_options`, parsed once per run) at construction.

Weights go through two endpoints the worker holds (:mod:`roll.weights`): a
:class:`~roll.weights.receiver.WeightReceiver` on every worker and a :class:`~roll.weights.sender.WeightSender` on a
training role's; :meth:`Worker.weights_in` and :meth:`Worker.weights_out` run one of their methods, named by
reference (``WeightSender.share_bucket``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch

from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.data.batch import Batch
from roll.distributed.placement import LOCAL_GPUS, visible_devices
from roll.network import node_ip
from roll.strategies.base import GenerationOutput, StrategyContext, TrainingStrategy
from roll.strategies.registry import build_strategy, strategy_spec
from roll.weights.receiver import WeightReceiver
from roll.weights.sender import WeightSender

P = ParamSpec("P")
R = TypeVar("R")


class Worker:
    """Role ``role``, rank ``rank`` of ``world_size``; forwards calls to its strategy and times them."""

    def __init__(
        self,
        role: str,
        config: WorkerConfig,
        rank: int,
        world_size: int,
        master_port: int,
        num_threads: int | None = None,
    ):
        if os.environ.get(LOCAL_GPUS) is not None:  # a GPU slot's actor: pick its GPUs before CUDA starts
            os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices(
                os.environ.pop(LOCAL_GPUS), os.environ.get("CUDA_VISIBLE_DEVICES")
            )
        os.environ.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port),
                "RANK": str(rank),
                "LOCAL_RANK": "0" if not torch.cuda.is_available() else os.environ.get("LOCAL_RANK", "0"),
                "WORLD_SIZE": str(world_size),
            }
        )
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.role, self.rank, self.world_size = role, rank, world_size
        name = config.strategy_args.strategy_name
        self.spec = strategy_spec(name)
        self.strategy = build_strategy(config, role, rank, world_size)  # contract checked, the launch's options
        self.receiver = WeightReceiver(self.strategy, self.spec.abilities, f"{role}: strategy {name!r}")
        self.sender = WeightSender(self.strategy, rank, role) if isinstance(self.strategy, TrainingStrategy) else None
        self.policy_version = 0  # the driver's count of weight syncs (roll.rollout.buffer), set after each
        self._request_versions: dict[str, int] = {}  # submitted request -> the version it started under

    def initialize(self, ctx: StrategyContext) -> float:
        """Build the strategy; returns seconds taken."""
        start = time.perf_counter()
        self.strategy.initialize(ctx)
        return time.perf_counter() - start

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        with self.receiver.turns:  # a weight load waits for this call, and this call for a load in progress
            version = self.policy_version
            outputs = self.strategy.generate(prompts, args, max_new_tokens)
        for out in outputs:
            out.policy_version = version
        return outputs

    def set_policy_version(self, version: int) -> None:
        """The driver's weight-sync count, after a sync: outputs started from now on carry it. A label is never
        newer than the weights that made the tokens (set after the weights are in)."""
        with self.receiver.turns:
            self.policy_version = version

    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        return self.strategy.compute_log_probs(batch, with_entropy)

    def compute_base_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The base model's log-probs: actor_train with its LoRA adapters off (reference log-probs)."""
        return self.strategy.compute_base_log_probs(batch)

    def data_parallel_info(self) -> tuple[int, int, bool]:
        """``(data-parallel rank, data-parallel size, whether this rank's results are kept)`` for ``call_dp``
        (:meth:`roll.strategies.base.Strategy.data_parallel_info`)."""
        return self.strategy.data_parallel_info()

    def compute_values(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Critic values ``{"values": (B, L-1)}`` (the critic role)."""
        return self.strategy.compute_values(batch)

    def train_step(
        self,
        batch: Batch,
        loss_fn: Callable,
        lr: float | None = None,
        with_entropy: bool = False,
        return_log_probs: bool = False,
    ) -> dict[str, Any]:
        return self.strategy.train_step(batch, loss_fn, lr, with_entropy, return_log_probs)

    def reset_optimizer(self) -> None:
        self.strategy.reset_optimizer()

    def profile_train_step(self, batch: Batch, loss_fn: Callable, rows: int = 25, **kwargs: Any) -> str:
        """One ``train_step`` under ``torch.profiler``: the table of the ``rows`` most expensive operations (by
        device time on GPU, CPU time otherwise), for ``benchmarks/gpu_step.py --profile``."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            self.strategy.train_step(batch, loss_fn, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        return prof.key_averages().table(sort_by=key, row_limit=rows)

    # ------------------------------------------------------------------ weights (the two endpoints' entry points)
    def weights_out(self, method: Callable[Concatenate[WeightSender, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``method``, a :class:`~roll.weights.sender.WeightSender` method given by reference
        (``WeightSender.share_bucket``), on this worker's sender (a training strategy's), with ``args``."""
        if self.sender is None:
            raise TypeError(
                f"{self.role}: strategy {self.spec.name!r} sends no weights (only a training strategy does)"
            )
        return _bound(self.sender, WeightSender, method)(*args, **kwargs)

    def weights_in(self, method: Callable[Concatenate[WeightReceiver, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``method``, a :class:`~roll.weights.receiver.WeightReceiver` method given by reference
        (``WeightReceiver.load``), on this worker's receiver, with ``args``."""
        return _bound(self.receiver, WeightReceiver, method)(*args, **kwargs)

    def _needs(self, ability: str, purpose: str) -> None:
        """A TypeError naming the strategy when its registry entry does not declare ``ability``."""
        if not self.spec.can(ability):
            raise TypeError(
                f"{self.role}: strategy {self.spec.name!r} cannot {purpose} (its registry entry "
                f"declares no {ability!r} ability)"
            )

    # ------------------------------------------------------------------ per-request generation (ability "submit")
    def submit(
        self, requests: list[tuple[str, list[int]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[str]:
        """Queue ``(rid, prompt ids)`` requests on the engine; returns the engine's request ids."""
        self._needs("submit", "take single requests")
        sent = self.strategy.submit(requests, args, max_new_tokens)
        self._request_versions.update(dict.fromkeys(sent, self.policy_version))  # the engine's ids (rid#k for n > 1)
        return sent

    def poll(self, rids: list[str] | None = None, timeout: float | None = 0.05) -> dict[str, GenerationOutput]:
        """Finished requests among ``rids``, waiting at most ``timeout`` s for the first one; each carries the
        policy version it was submitted under (the oldest of its tokens)."""
        done = self.strategy.poll(rids, timeout)
        for rid, out in done.items():
            out.policy_version = self._request_versions.pop(rid, self.policy_version)
        return done

    def abort(self, rids: list[str] | None = None) -> list[str]:
        """Abort requests in flight (``None``: all); returns the aborted ids."""
        aborted = self.strategy.abort(rids)
        for rid in aborted:
            self._request_versions.pop(rid, None)
        return aborted

    def save_pretrained(self, path: str) -> None:
        self.strategy.save_pretrained(path)

    def save_checkpoint(self, path: str) -> None:
        self.strategy.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.strategy.load_checkpoint(path)

    def offload_states(self) -> None:
        self.strategy.offload_states()

    def reload_states(self) -> None:
        self.strategy.reload_states()

    def rng_state(self) -> dict[str, Any]:
        """This process's RNG states (python, numpy, torch CPU and CUDA), for checkpoints."""
        return get_rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned."""
        set_rng_state(state)

    def memory_stats(self) -> dict[str, float]:
        """CUDA memory in GiB (``{}`` on CPU): this process's peak allocated and reserved since start, what it
        reserves now, and the GPU's use by all processes and its total."""
        if not torch.cuda.is_available():
            return {}
        free, total = torch.cuda.mem_get_info()
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30,
            "gpu_used_gib": (total - free) / 2**30,
            "gpu_total_gib": total / 2**30,
        }

    def ping(self) -> Any:
        return self.role, self.rank, os.getpid()

    def location(self) -> str:
        """Where this worker runs: its Ray node (id prefix and IP) and its GPUs, for the startup log."""
        import ray

        node = ray.get_runtime_context().get_node_id()[:8] if ray.is_initialized() else "local"
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES") if torch.cuda.is_available() else None
        return f"node {node} ({node_ip()})" + (f", GPU {gpus}" if gpus else "")


def _bound(obj: Any, endpoint: type, method: Callable[..., R]) -> Callable[..., R]:
    """``method``, a method of class ``endpoint`` given by reference, bound to ``obj`` (an instance of it or of a
    subclass, whose override runs); a TypeError for anything else: the entry points run endpoint methods only."""
    if getattr(endpoint, getattr(method, "__name__", ""), None) is not method:
        raise TypeError(f"{method!r} is not a method of {endpoint.__name__}; pass one as {endpoint.__name__}.<name>")
    return getattr(obj, method.__name__)


def get_rng_state() -> dict[str, Any]:
    """RNG states of this process: ``{"python", "numpy", "torch", "cuda" (list per device, GPU only)}``."""
    import random

    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from :func:`get_rng_state` (the CUDA part only where this process has GPUs)."""
    import random

    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
