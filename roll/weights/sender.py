"""The sending side of the weight sync on one rank of a training role: :class:`WeightSender`, around a training
strategy (:class:`WeightSource`).

What travels is decided in one place per kind of sync. Full weights: :meth:`WeightSender.buckets`, the named
tensors bucket by bucket (the strategy's ``weight_buckets``; with LoRA the merged weights, for an engine that cannot
serve adapters), which every full-weight mode reads: the bucket plan receivers allocate from
(:meth:`~WeightSender.plan`), the copy to CPU (:meth:`~WeightSender.gather`, and :meth:`~WeightSender.write_shared`
for shared memory), the in-process buckets of ``direct``, the CUDA IPC payloads (:meth:`~WeightSender.share_bucket`)
and the NCCL broadcast (:meth:`~WeightSender.broadcast`). The adapter-only sync of a LoRA run:
:meth:`WeightSender.adapter` (the adapter's tensors and peft config; the base weights never travel).

Every rank of the role calls each method in step (ZeRO-3, FSDP2 and Megatron gather each bucket collectively);
rank 0 is the one that sends. A worker holds one sender and runs its methods for the driver
(:meth:`roll.distributed.worker.Worker.weights_out`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Protocol

import torch

from roll.network import free_port, node_ip
from roll.weights.buckets import DEFAULT_BUCKET_BYTES, NamedTensors, bucket_meta, tensor_nbytes
from roll.weights.group import WeightGroup
from roll.weights.shared_memory import Layout, write_shared


class WeightSource(Protocol):
    """A training strategy as the sender sees it (``roll.strategies.base.TrainingStrategy`` is one)."""

    def weight_buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """The full weights on this worker's device, bucket by bucket; every rank iterates (gathers may be
        collective); a bucket stays valid until the next is requested."""
        ...


class WeightSender:
    """Rank ``rank`` of a training role as a weight sender: its strategy's tensors, the weight groups it hosts
    (rank 0) and the CUDA IPC bucket it keeps alive between calls."""

    def __init__(self, source: WeightSource, rank: int, role: str = "actor_train"):
        self.source, self.rank, self.role = source, rank, role
        self.groups: dict[str, WeightGroup] = {}  # weight groups this rank hosts, by name (rank 0 only)
        self._ipc_buckets: Iterator[NamedTensors] | None = None  # the CUDA IPC sync in progress
        self._ipc_buffer: torch.Tensor | None = None  # the shared bucket, alive until the next call

    # ------------------------------------------------------------------ what travels (the one place)
    def buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """The named tensors to send, in buckets of about ``bucket_bytes`` (full weights: the strategy's
        ``weight_buckets``). Every sync mode reads this method and nothing else of the strategy."""
        return iter(self.source.weight_buckets(bucket_bytes))

    def adapter(self) -> tuple[NamedTensors, dict] | None:
        """What travels in an adapter-only sync (LoRA, mode ``adapter``): the adapter's tensors as CPU copies under
        peft's state-dict names and its peft config, ``(tensors, config)`` on rank 0, None on the others. Every
        rank calls (the gathers are collective). The base weights never travel: they do not change."""
        tensors = list(self.source.adapter_weights())  # type: ignore[attr-defined]
        if self.rank != 0:
            return None
        config = self.source.adapter_config()  # type: ignore[attr-defined]
        return [(name, t.detach().to("cpu", copy=True)) for name, t in tensors], config

    def plan(self, bucket_bytes: int) -> list[dict[str, list]]:
        """The bucket plan of :meth:`buckets` (``BucketMeta`` as dicts: names, dtypes, full shapes), what receivers
        allocate from, in send order. Iterates the buckets once (every rank must call)."""
        return [bucket_meta(bucket).to_dict() for bucket in self.buckets(bucket_bytes)]

    # ------------------------------------------------------------------ copy (through Ray, a list or shared memory)
    def gather(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> NamedTensors:
        """Rank 0: CPU copies of every tensor of :meth:`buckets`, in order; the other ranks take part in the
        gathers and return ``[]``."""
        out: NamedTensors = []
        for bucket in self.buckets(bucket_bytes):
            if self.rank == 0:
                out += [(name, t.detach().to("cpu", copy=True)) for name, t in bucket]
        return out

    def write_shared(self, path: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Layout | None:
        """Rank 0 writes :meth:`gather`'s weights into the new shared-memory file ``path`` and returns their layout
        (:func:`roll.weights.shared_memory.write_shared`); the other ranks take part and return None."""
        weights = self.gather(bucket_bytes)
        return write_shared(path, weights) if weights else None

    # ------------------------------------------------------------------ zero-copy (CUDA IPC, colocated)
    def share_bucket(self, bucket_bytes: int) -> bytes | None:
        """The CUDA IPC payload of the next bucket (:mod:`roll.weights.ipc`), or None after the last. Every rank
        calls in step; each shares its own GPU's copy and keeps it alive until its next call."""
        from roll.weights.ipc import share_bucket

        if self._ipc_buckets is None:
            self._ipc_buckets = self.buckets(bucket_bytes)
        self._ipc_buffer = None  # the previous bucket's receivers are done
        bucket = next(self._ipc_buckets, None)
        if bucket is None:
            self._ipc_buckets = None
            return None
        payload, self._ipc_buffer = share_bucket(bucket)
        return payload

    # ------------------------------------------------------------------ broadcast (NCCL weight group, disaggregated)
    def endpoint(self) -> tuple[str, int]:
        """``(node IP, free port)`` on this rank's node, where it can host a weight group."""
        host = node_ip()
        return host, free_port(host)

    def host_group(self, host: str, port: int, world_size: int, group_name: str, backend: str = "nccl") -> None:
        """Rank 0 hosts weight group ``group_name`` as its rank 0 (the other ranks take no part); blocks until all
        ``world_size`` members joined: start the receivers' joins together with it."""
        if self.rank != 0:
            return
        if group_name in self.groups:
            raise RuntimeError(f"{self.role}: weight group {group_name!r} is already set up")
        self.groups[group_name] = WeightGroup(host, port, 0, world_size, group_name, backend)

    def broadcast(self, bucket_bytes: int, group_name: str) -> dict[str, float]:
        """Rank 0 broadcasts every bucket of :meth:`buckets` in ``group_name``; every rank must call (gathers).
        Returns ``seconds``, ``buckets`` and ``bytes`` sent."""
        start, buckets, nbytes = time.perf_counter(), 0, 0
        group = self.groups.get(group_name)
        if self.rank == 0 and group is None:
            raise RuntimeError(f"{self.role}: no weight group {group_name!r}; host it first (host_group)")
        for bucket in self.buckets(bucket_bytes):
            if group is not None:
                group.send_bucket(bucket)
            buckets += 1
            nbytes += sum(tensor_nbytes(t) for _, t in bucket)
        return {"seconds": time.perf_counter() - start, "buckets": float(buckets), "bytes": float(nbytes)}
