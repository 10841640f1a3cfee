"""One interface for every backend: the abstract strategies a worker drives, one base per role.

=============  ============================  =================================================================
role           base                          what callers use (beyond :class:`Strategy`)
=============  ============================  =================================================================
actor_infer    :class:`InferenceStrategy`    ``generate``
reference      :class:`ScoringStrategy`      ``compute_log_probs``
actor_train    :class:`TrainStrategy`        ``train_step``, ``compute_log_probs``, weights out, checkpoints
critic         :class:`CriticStrategy`       ``train_step``, ``compute_values``, checkpoints
=============  ============================  =================================================================

What a strategy can do beyond its role is an *ability*, a :class:`typing.Protocol` of
:mod:`roll.strategies.abilities`,
declared in its registry entry and checked against its class by the registry. Every method a caller (worker,
weight sync, ``WorkerGroup.call_dp``) uses is declared here or in an ability; nothing is called by a name that is
declared nowhere. All calls are synchronous; batching and placement are the caller's concern.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.data.batch import Batch
from roll.strategies.abilities import ABILITIES, protocol_members


class LossFn(Protocol):
    """``loss_fn(log_probs (B,T), entropy (B,T) | None, micro_batch) -> (loss, metrics)``; T = sequence - 1.

    ``loss`` is the micro-batch's mean over some unit; a loss function that has ``normalizer(micro_batch) -> float``
    (the count of that unit: tokens or sequences) is accumulated exactly over micro-batches of any size (see
    :mod:`roll.strategies.microbatch`); without it, micro-batches are weighted by their samples."""

    def __call__(
        self, log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


@dataclass(frozen=True)
class StrategyContext:
    """Run-level settings a backend needs besides its worker block."""

    seed: int = 42
    max_grad_norm: float = 1.0  # 0 disables clipping
    total_steps: int = 0  # optimizer steps the learning-rate schedule spans
    max_running_requests: int | None = None  # most generation requests in flight per inference worker (None: any)
    async_rollouts: bool = False  # weights may change while requests are in flight (async_generation_ratio >= 1)


@dataclass
class GenerationOutput:
    """One generated sequence: new token ids (without the prompt) and their sampling log-probs."""

    token_ids: list[int]
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" (eos/stop token) or "length"
    policy_version: int = 0  # the weight syncs the engine had received when it started this sequence


class Strategy(ABC):
    """What every backend does: build its model, take weights in, free memory between phases.

    ``options`` is the typed ``strategy_config`` (an instance of the options class its registry entry names), parsed
    once per run (:func:`roll.strategies.registry.strategy_options`) and handed over by the worker; a strategy
    reads it, never the mapping."""

    def __init__(self, config: WorkerConfig, rank: int = 0, world_size: int = 1, *, options: Any):
        self.config, self.rank, self.world_size, self.options = config, rank, world_size, options

    @abstractmethod
    def initialize(self, ctx: StrategyContext) -> None:
        """Load the model (and optimizer) on this worker's device."""

    @abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace model weights with ``(name, tensor)`` pairs (names as in ``named_parameters``)."""

    def offload_states(self) -> None:
        """Free accelerator memory between phases (colocated roles); a no-op on CPU."""

    def reload_states(self) -> None:
        """Undo :meth:`offload_states`."""

    def data_parallel_info(self) -> tuple[int, int, bool]:
        """``(data-parallel rank, data-parallel size, whether this rank's results are kept)``, how
        ``WorkerGroup.call_dp`` splits a batch: by default every rank is a replica of its own. A model-parallel
        backend (megatron) overrides it: the ranks of one replica get the same chunk and one of them answers."""
        return self.rank, self.world_size, True


class ScoringStrategy(Strategy):
    """A backend that scores sequences (the ``reference`` role; the actor too)."""

    @abstractmethod
    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Token log-probs of ``batch['input_ids'][:, 1:]``: ``{"log_probs": (B,T-1)[, "entropy": (B,T-1)]}``."""


class InferenceStrategy(Strategy):
    """A backend that generates (the ``actor_infer`` role)."""

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        """Sample one continuation per prompt (token ids in, token ids out)."""

    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any]) -> None:
        """Serve a LoRA adapter on top of the loaded weights: peft's state-dict names and tensors (a trainer's
        ``adapter_weights``) and its peft config (``adapter_config``); the receiving side of an adapter-only sync."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve LoRA adapters")


class TrainingStrategy(Strategy):
    """What the two training roles share: optimizer steps, weights out, checkpoints."""

    @abstractmethod
    def train_step(
        self,
        batch: Batch,
        loss_fn: LossFn,
        lr: float | None = None,
        with_entropy: bool = False,
        return_log_probs: bool = False,
    ) -> dict[str, Any]:
        """One optimizer step per ``per_device_train_batch_size x gradient_accumulation_steps`` samples of
        ``batch`` (each split into micro-batches, gradients accumulated exactly); returns mean metrics.

        ``lr`` overrides the scheduled learning rate for this step (supervised warm start). ``return_log_probs``:
        the result also holds ``"log_probs"`` (B, L-1), each sample's detached log-probs from its training
        forward (the old log-probs when the separate pass is skipped). The critic's ``loss_fn`` gets values
        (B, L-1) in place of log-probs."""

    @abstractmethod
    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Full (gathered) weights as ``(name, cpu tensor)`` pairs, for export and checks (the weight sync reads
        :meth:`weight_buckets`).

        Called on every rank of the role (gathering may be collective); rank 0 returns the weights, other ranks
        may return an empty list."""

    @abstractmethod
    def weight_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The full weights on this worker's device, bucket by bucket (about ``bucket_bytes`` each, in a fixed
        order): what every weight sync sends (:class:`roll.weights.sender.WeightSender`, through its ``buckets``).
        Every rank iterates (gathers may be collective); a yielded bucket stays valid until the next is requested."""

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


class TrainStrategy(TrainingStrategy, ScoringStrategy):
    """The ``actor_train`` role: trains the policy and scores sequences with it (old log-probs). A backend that
    trains LoRA adapters (``model_args.lora_target``) sets :attr:`supports_lora` and implements the three methods
    below (the preflight refuses LoRA on any other)."""

    #: whether the backend builds LoRA adapters from ``model_args`` (:mod:`roll.models.lora`)
    supports_lora: ClassVar[bool] = False

    def compute_base_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """``{"log_probs": (B, L-1)}`` with the LoRA adapters off: the base model's (reference) log-probs."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapters")

    def adapter_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The LoRA adapter's whole tensors under peft's state-dict names (the sending side of an adapter-only
        sync); every rank calls (gathers may be collective), rank 0 returns them, the others may return ``[]``."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapters")

    def adapter_config(self) -> dict[str, Any]:
        """The LoRA adapter's peft config as a plain dict (with :meth:`adapter_weights`, what an engine loads)."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapters")


class CriticStrategy(TrainingStrategy):
    """The ``critic`` role: a value model. ``train_step``'s loss function gets values for log-probs; it has no
    token log-probs."""

    @abstractmethod
    def compute_values(self, batch: Batch) -> dict[str, torch.Tensor]:
        """``{"values": (B, L-1)}``, one value per position of the log-prob frame (:mod:`roll.data.layout`)."""


#: The base class each role's strategy must derive from.
ROLE_BASES: dict[str, type] = {  # abstract classes: type[Strategy] would ask for concrete ones
    "actor_infer": InferenceStrategy,
    "reference": ScoringStrategy,
    "actor_train": TrainStrategy,
    "critic": CriticStrategy,
}


def contract_gaps(cls: type, role: str, abilities: Iterable[str]) -> list[str]:
    """What ``cls`` lacks to serve ``role`` with ``abilities``: the missing base class, then missing or still
    abstract methods (empty when it fits)."""
    gaps = []
    base = ROLE_BASES[role]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        gaps.append(f"subclass {base.__name__}")
    gaps += [f"implement {m}" for m in sorted(getattr(cls, "__abstractmethods__", ()))]
    for ability in sorted(abilities):
        gaps += [
            f"implement {m} (ability {ability})"
            for m in protocol_members(ABILITIES[ability])
            if not callable(getattr(cls, m, None))
        ]
    return gaps
