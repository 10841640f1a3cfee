"""The weight faces of the role proxies: :class:`WeightsOut` (``TrainProxy.weights_out``) and :class:`WeightsIn`
(``RoleProxy.weights_in``), what the weight sync (:mod:`roll.weights.sync`: its ``Sender`` and ``Receiver``
Protocols) and the launch's weight copy drive.

Each method runs one method of the worker's endpoint (:class:`~roll.weights.sender.WeightSender`,
:class:`~roll.weights.receiver.WeightReceiver`) through the worker's two entry points
(:meth:`~roll.distributed.worker.Worker.weights_out`, :meth:`~roll.distributed.worker.Worker.weights_in`), named by
function reference, and says how the call spreads over the role's ranks: every rank (the sender's ranks gather in
step; rank 0's result is the answer), rank 0 only, one call per worker, or started without waiting (handles for
``wait``: the two sides of a broadcast must be in flight together).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from roll.distributed.group import RayWorkerGroup, WorkerGroup
from roll.distributed.worker import Worker
from roll.weights.buckets import DEFAULT_BUCKET_BYTES, NamedTensors
from roll.weights.receiver import WeightReceiver
from roll.weights.sender import WeightSender
from roll.weights.shared_memory import Layout


class WeightsOut:
    """A training role's weights going out (the sync's ``Sender``)."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    @property
    def passes_refs(self) -> bool:
        """Ray: a started call's handle is an object ref another role's call can take as its argument, so the
        weights go from worker to worker through the object store, never through the driver."""
        return isinstance(self.group, RayWorkerGroup)

    def plan(self, bucket_bytes: int) -> list[dict[str, list]]:
        """The bucket plan of what the trainer sends (``BucketMeta`` dicts; every rank iterates, rank 0 answers)."""
        return self.group.call(Worker.weights_out, WeightSender.plan, bucket_bytes)[0]

    def gather(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> NamedTensors:
        """The weights to send as CPU tensors: every rank takes part in gathering, rank 0's list is returned."""
        return self.group.call(Worker.weights_out, WeightSender.gather, bucket_bytes)[0]

    def start_gather(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Any]:
        """:meth:`gather` started on every rank without waiting; handles in rank order, for :meth:`wait` (on Ray,
        rank 0's handle can be another role's argument: :attr:`passes_refs`)."""
        return self.group.call_async(Worker.weights_out, WeightSender.gather, bucket_bytes)

    def adapter(self) -> tuple[NamedTensors, dict]:
        """The LoRA adapter (tensors as CPU copies, peft config): every rank takes part in gathering, rank 0's is
        returned."""
        return self.group.call(Worker.weights_out, WeightSender.adapter)[0]

    def start_adapter(self) -> list[Any]:
        """:meth:`adapter` started on every rank without waiting; handles in rank order (rank 0's first)."""
        return self.group.call_async(Worker.weights_out, WeightSender.adapter)

    def write_shared(self, path: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Layout:
        """Every rank takes part in gathering; rank 0 writes the weights into the new shared-memory file ``path``;
        their layout."""
        return self.group.call(Worker.weights_out, WeightSender.write_shared, path, bucket_bytes)[0]

    def buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """Rank 0's generator of device buckets (``direct`` sync: in-process only, a generator does not cross
        processes)."""
        return self.group.call_rank0(Worker.weights_out, WeightSender.buckets, bucket_bytes)

    def share_bucket(self, bucket_bytes: int) -> list[bytes | None]:
        """Every rank's CUDA IPC payload of the next bucket (None after the last), in rank order."""
        return self.group.call(Worker.weights_out, WeightSender.share_bucket, bucket_bytes)

    def endpoint(self) -> tuple[str, int]:
        """``(node IP, free port)`` on rank 0's node, where it hosts a weight group."""
        return self.group.call_rank0(Worker.weights_out, WeightSender.endpoint)

    def host_group(self, host: str, port: int, world_size: int, group_name: str, backend: str) -> list[Any]:
        """Start hosting weight group ``group_name`` (rank 0 is its rank 0); handles to :meth:`wait` on."""
        return self.group.call_async(
            Worker.weights_out, WeightSender.host_group, host, port, world_size, group_name, backend
        )

    def broadcast(self, bucket_bytes: int, group_name: str) -> list[Any]:
        """Start broadcasting every bucket in ``group_name`` (every rank joins the gathers); handles whose first
        result is rank 0's ``seconds`` / ``buckets`` / ``bytes``."""
        return self.group.call_async(Worker.weights_out, WeightSender.broadcast, bucket_bytes, group_name)

    def wait(self, handles: list[Any]) -> list[Any]:
        """Results of started calls (of any role), failing fast when one raises."""
        return self.group.wait(handles)


class WeightsIn:
    """Weights coming into a role (the sync's ``Receiver``; every role has one: the launch copies the actor's
    weights into ``reference`` and ``critic`` too)."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def load(self, named_tensors: Any) -> list[float]:
        """Every worker loads ``(name, tensor)`` pairs (a list, or a Ray object ref of one); seconds per worker."""
        return self.group.call(Worker.weights_in, WeightReceiver.load, named_tensors)

    def load_adapter(self, adapter: Any) -> list[float]:
        """Every worker serves the LoRA adapter ``(tensors, config)`` (or a Ray object ref of it); seconds per worker
        (ability ``lora_adapters``)."""
        return self.group.call(Worker.weights_in, WeightReceiver.load_adapter, adapter)

    def load_shared(self, path: str, layout: Layout) -> list[float]:
        """Every worker loads the weights written to the shared-memory file ``path``; seconds per worker."""
        return self.group.call(Worker.weights_in, WeightReceiver.load_shared, path, layout)

    def load_bucket(self, per_worker: list[tuple[list[bytes], bool]]) -> list[float]:
        """Worker ``i`` loads the CUDA IPC bucket ``per_worker[i]`` (its payloads, whether it is the last); seconds
        per worker (ability ``ipc_weights``)."""
        return self.group.call_each(Worker.weights_in, [(WeightReceiver.load_bucket, *args) for args in per_worker])

    def join_group(
        self, host: str, port: int, ranks_per_worker: int, world_size: int, group_name: str, backend: str
    ) -> list[Any]:
        """Start every worker joining weight group ``group_name`` at ranks ``1 + r * ranks_per_worker ..``
        (ability ``weight_group``); handles to wait on together with the sender's."""
        return self.group.call_each_async(
            Worker.weights_in,
            {
                r: (WeightReceiver.join_group, host, port, 1 + r * ranks_per_worker, world_size, group_name, backend)
                for r in range(self.world_size)
            },
        )

    def receive(self, metas: list[dict[str, list]], group_name: str) -> list[Any]:
        """Start every worker receiving the buckets ``metas`` describes (ability ``weight_group``); handles."""
        return self.group.call_async(Worker.weights_in, WeightReceiver.receive, metas, group_name)
