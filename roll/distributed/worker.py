"""A worker: one rank of one role, holding one strategy. Runs as a Ray actor or in-process (local mode)."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch

from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.data.batch import Batch
from roll.strategies.base import GenerationOutput, StrategyContext
from roll.strategies.registry import get_strategy_class


class Worker:
    """Role ``role``, rank ``rank`` of ``world_size``; forwards calls to its strategy and times them."""

    def __init__(self, role: str, config: WorkerConfig, rank: int, world_size: int, master_port: int,
                 num_threads: int | None = None):
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port), "RANK": str(rank),
                           "LOCAL_RANK": "0" if not torch.cuda.is_available() else os.environ.get("LOCAL_RANK", "0"),
                           "WORLD_SIZE": str(world_size)})
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.role, self.rank = role, rank
        self.strategy = get_strategy_class(config.strategy_args.strategy_name, role)(config, rank, world_size)

    def initialize(self, ctx: StrategyContext) -> float:
        """Build the strategy; returns seconds taken."""
        start = time.perf_counter()
        self.strategy.initialize(ctx)
        return time.perf_counter() - start

    def generate(self, prompts: list[list[int]], args: GeneratingArgs,
                 max_new_tokens: int | None = None) -> list[GenerationOutput]:
        return self.strategy.generate(prompts, args, max_new_tokens)

    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        return self.strategy.compute_log_probs(batch, with_entropy)

    def compute_values(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Critic values ``{"values": (B, L-1)}`` (strategies with a value head only)."""
        if not hasattr(self.strategy, "compute_values"):
            raise TypeError(f"{self.role}: strategy {type(self.strategy).__name__} has no value head; "
                            "compute_values needs the critic role")
        return self.strategy.compute_values(batch)

    def train_step(self, batch: Batch, loss_fn: Callable, lr: float | None = None,
                   with_entropy: bool = False) -> dict[str, float]:
        return self.strategy.train_step(batch, loss_fn, lr, with_entropy)

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.strategy.named_weights())

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> float:
        start = time.perf_counter()
        self.strategy.load_weights(named_tensors)
        return time.perf_counter() - start

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
        """Peak CUDA memory of this process since start, in GiB (``{}`` on CPU)."""
        if not torch.cuda.is_available():
            return {}
        return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / 2 ** 30,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2 ** 30}

    def ping(self) -> Any:
        return self.role, self.rank, os.getpid()


def get_rng_state() -> dict[str, Any]:
    """RNG states of this process: ``{"python", "numpy", "torch", "cuda" (list per device, GPU only)}``."""
    import random

    import numpy as np

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
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
