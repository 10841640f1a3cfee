"""Abilities: what a strategy may offer beyond its role, each a :class:`typing.Protocol`.

A strategy declares its abilities in its registry entry (``register_strategy(..., abilities={"submit"})``); the
registry checks that its class has every method of each declared Protocol, and callers (the rollout scheduler,
the weight sync) read the entry, never probe the class. This module imports nothing heavy, so the registry can
name the abilities without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from roll.config.worker import GeneratingArgs, WorkerConfig


@runtime_checkable
class Submits(Protocol):
    """Ability ``submit``: takes generation requests one at a time and batches them itself."""

    def submit(
        self, requests: list[tuple[str, list[int]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[str]:
        """Queue ``(rid, prompt ids)`` requests; returns the engine's request ids."""

    def poll(self, rids: list[str] | None = None, timeout: float | None = 0.05) -> dict[str, Any]:
        """Finished requests among ``rids`` (None: any) as ``GenerationOutput``, waiting at most ``timeout`` s for
        the first."""

    def abort(self, rids: list[str] | None = None) -> list[str]:
        """Abort requests in flight (None: all); returns the aborted ids."""


@runtime_checkable
class ReceivesWeightGroup(Protocol):
    """Ability ``weight_group``: receives weights by broadcast in an NCCL weight group (disaggregated sync)."""

    @classmethod
    def weight_group_ranks(cls, config: WorkerConfig, options: Any) -> int:
        """Group ranks one worker of block ``config`` (typed ``options``) takes: its engine's TP size; read before
        it starts."""

    def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
    ) -> None:
        """Join the group at ranks ``rank_offset ..``; blocks until all ``world_size`` members joined."""

    def update_weights_distributed(self, metas: list[dict[str, Any]], group_name: str) -> float:
        """Receive the buckets ``metas`` (``BucketMeta`` dicts) describes from the group's rank 0; seconds."""


@runtime_checkable
class ReceivesIpcBuckets(Protocol):
    """Ability ``ipc_weights``: loads weight buckets shared by CUDA IPC from a trainer on the same GPUs."""

    def load_weight_bucket(self, payloads: list[bytes], flush: bool) -> None:
        """Load one shared bucket (one payload per GPU of this worker, in its GPU order)."""


@runtime_checkable
class ServesAdapters(Protocol):
    """Ability ``lora_adapters``: serves a LoRA adapter on its base weights, replaced at every sync (the receiving
    side of the adapter-only sync: :mod:`roll.weights.sync`, mode ``adapter``)."""

    def load_adapter(self, named_tensors: Any, config: dict[str, Any]) -> None:
        """Serve the adapter ``named_tensors`` (peft's state-dict names) with its peft ``config`` from now on."""


#: Abilities a strategy may declare: name -> the Protocol its class must satisfy.
ABILITIES: dict[str, type] = {
    "submit": Submits,
    "weight_group": ReceivesWeightGroup,
    "ipc_weights": ReceivesIpcBuckets,
    "lora_adapters": ServesAdapters,
}


def protocol_members(protocol: type) -> list[str]:
    """The methods a Protocol declares, in definition order."""
    return [n for n, v in vars(protocol).items() if not n.startswith("_") and callable(getattr(protocol, n))]
