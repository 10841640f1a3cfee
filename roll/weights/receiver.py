"""The receiving side of the weight sync on one worker of any role: :class:`WeightReceiver`, around a strategy that
loads weights (:class:`WeightSink`).

Generation and weight loading take turns (:attr:`WeightReceiver.turns`, a lock the worker's ``generate`` holds too):
in local mode they come from different threads, and a weight update waits for the generate call in progress, so
it lands between turns and discards no token. Every load returns its seconds, the wait for that turn included.

Beyond :meth:`~WeightReceiver.load` (any strategy), the ways in need an ability the strategy's registry entry
declares: ``ipc_weights`` for CUDA IPC buckets (:meth:`~WeightReceiver.load_bucket`), ``weight_group`` for the
NCCL broadcast (:meth:`~WeightReceiver.join_group`, :meth:`~WeightReceiver.receive`). A worker holds one receiver
and runs its methods for the driver (:meth:`roll.distributed.worker.Worker.weights_in`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

import torch

from roll.weights.shared_memory import Layout, read_shared


class WeightSink(Protocol):
    """A strategy as the receiver sees it: every strategy loads named tensors; one that declares ``ipc_weights``
    also has ``load_weight_bucket(payloads, flush)``, one that declares ``weight_group`` has
    ``init_weight_group(...)`` and ``update_weights_distributed(metas, group_name)``
    (``roll.strategies.abilities``)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace model weights with ``(name, tensor)`` pairs."""
        ...


class WeightReceiver:
    """One worker as a weight receiver. ``abilities``: what the strategy's registry entry declares; ``who`` names the
    worker in errors (``"actor_infer: strategy 'hf_infer'"``)."""

    def __init__(self, sink: WeightSink, abilities: frozenset[str] | set[str], who: str):
        self.sink, self.abilities, self.who = sink, frozenset(abilities), who
        self.turns = threading.Lock()  # generation and weight loading take turns (module docstring)

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load ``(name, tensor)`` pairs (on Ray also an object ref of them, resolved by Ray); seconds."""
        start = time.perf_counter()
        with self.turns:
            self.sink.load_weights(named_tensors)
        return time.perf_counter() - start

    def load_adapter(self, adapter: tuple[Any, dict[str, Any]]) -> float:
        """Serve the LoRA adapter ``(tensors, config)`` (a sender's :meth:`~roll.weights.sender.WeightSender.adapter`;
        on Ray also an object ref of it, resolved by Ray) from the next generation on; seconds (ability
        ``lora_adapters``)."""
        self._needs("lora_adapters", "serve LoRA adapters")
        tensors, config = adapter
        start = time.perf_counter()
        with self.turns:
            self.sink.load_adapter(tensors, config)  # type: ignore[attr-defined]
        return time.perf_counter() - start

    def load_shared(self, path: str, layout: Layout) -> float:
        """Load the weights another worker wrote to the shared-memory file ``path``; seconds."""
        return self.load(read_shared(path, layout))

    def load_bucket(self, payloads: list[bytes], flush: bool) -> float:
        """Load one CUDA IPC bucket (one payload per GPU of this worker, in its GPU order); seconds."""
        self._needs("ipc_weights", "load CUDA IPC weight buckets")
        start = time.perf_counter()
        with self.turns:
            self.sink.load_weight_bucket(payloads, flush)  # type: ignore[attr-defined]
        return time.perf_counter() - start

    def join_group(
        self, host: str, port: int, rank_offset: int, world_size: int, group_name: str, backend: str = "nccl"
    ) -> None:
        """Join weight group ``group_name`` at ranks ``rank_offset ..`` (the engine's TP ranks); blocks until all
        ``world_size`` members joined: start the sender's hosting together with it."""
        self._needs("weight_group", "join a weight group")
        self.sink.init_weight_group(host, port, rank_offset, world_size, group_name, backend)  # type: ignore[attr-defined]

    def receive(self, metas: list[dict[str, Any]], group_name: str) -> float:
        """Receive the buckets ``metas`` describes from the group's rank 0; the strategy's seconds."""
        self._needs("weight_group", "receive weights by broadcast")
        with self.turns:
            return self.sink.update_weights_distributed(metas, group_name)  # type: ignore[attr-defined]

    def _needs(self, ability: str, purpose: str) -> None:
        """A TypeError naming the strategy when its registry entry does not declare ``ability``."""
        if ability not in self.abilities:
            raise TypeError(f"{self.who} cannot {purpose} (its registry entry declares no {ability!r} ability)")
