"""One interface for every backend: the abstract strategies a worker drives.

``InferenceStrategy`` generates and scores; ``TrainStrategy`` also trains, checkpoints and exports weights.
All calls are synchronous; batching and placement are the caller's concern.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.data.batch import Batch

#: ``loss_fn(log_probs (B,T), entropy (B,T) | None, micro_batch) -> (loss, metrics)``; T = sequence - 1.
LossFn = Callable[[torch.Tensor, "torch.Tensor | None", Batch], "tuple[torch.Tensor, dict[str, float]]"]


@dataclass(frozen=True)
class StrategyContext:
    """Run-level settings a backend needs besides its worker block."""

    seed: int = 42
    max_grad_norm: float = 1.0  # 0 disables clipping
    total_steps: int = 0  # optimizer steps the learning-rate schedule spans


@dataclass
class GenerationOutput:
    """One generated sequence: new token ids (without the prompt) and their sampling log-probs."""

    token_ids: list[int]
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" (eos/stop token) or "length"


class Strategy(ABC):
    """What every backend does: build its model and move weights in and out."""

    def __init__(self, config: WorkerConfig, rank: int = 0, world_size: int = 1):
        self.config, self.rank, self.world_size = config, rank, world_size

    @abstractmethod
    def initialize(self, ctx: StrategyContext) -> None:
        """Load the model (and optimizer) on this worker's device."""

    @abstractmethod
    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Token log-probs of ``batch['input_ids'][:, 1:]``: ``{"log_probs": (B,T-1)[, "entropy": (B,T-1)]}``."""

    @abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace model weights with ``(name, tensor)`` pairs (names as in ``named_parameters``)."""

    def offload_states(self) -> None:
        """Free accelerator memory between phases (colocated roles); a no-op on CPU."""

    def reload_states(self) -> None:
        """Undo :meth:`offload_states`."""


class InferenceStrategy(Strategy):
    """A backend that generates."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], args: GeneratingArgs,
                 max_new_tokens: int | None = None) -> list[GenerationOutput]:
        """Sample one continuation per prompt (token ids in, token ids out)."""


class TrainStrategy(Strategy):
    """A backend that trains."""

    @abstractmethod
    def train_step(self, batch: Batch, loss_fn: LossFn, lr: float | None = None,
                   with_entropy: bool = False) -> dict[str, float]:
        """One optimizer step over ``batch`` (split into micro-batches, gradients accumulated).

        ``lr`` overrides the scheduled learning rate for this step (supervised warm start)."""

    @abstractmethod
    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Full (gathered) weights as ``(name, cpu tensor)`` pairs for syncing to inference workers.

        Called on every rank of the role (gathering may be collective); rank 0 returns the weights, other ranks
        may return an empty list."""

    def reset_optimizer(self) -> None:
        """Forget the optimizer's moment estimates (a new training phase starts, e.g. RL after the warm start)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reset its optimizer")

    @abstractmethod
    def save_pretrained(self, path: str) -> None:
        """Export the model (and tokenizer) in Hugging Face format."""

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Save model, optimizer and scheduler states to continue training exactly."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""
