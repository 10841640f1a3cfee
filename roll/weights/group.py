"""A weight-sync process group between the trainer and inference engines, separate from every other group.

Disaggregated weight sync (``actor_infer`` on GPUs of its own) broadcasts the trainer's weights to the inference
engines over NCCL. The trainer process already belongs to DeepSpeed's default process group and each SGLang engine
to its own tensor-parallel group, so the weight group is a group of its own: its own TCPStore rendezvous and its
own communicator. Rank 0 is the trainer (it hosts the TCPStore), engine TP ranks follow at their ``rank_offset``.

Store layout: the group must find the keys SGLang's ``init_weights_update_group`` uses on the engine side. SGLang
(0.5.16) joins through ``rendezvous("tcp://host:port", rank, world_size)``, wraps that store in
``PrefixStore(group_name)`` and hands it to torch's process-group constructor, which adds ``"{group_name}/"`` and
``"{device}/"`` (``cuda`` for NCCL, ``cpu`` for gloo) prefixes before building the backend. :class:`WeightGroup`
builds the same chain of prefixes over a plain ``TCPStore`` and constructs the backend (``ProcessGroupNCCL`` /
``ProcessGroupGloo``) directly. It deliberately does not go through ``torch.distributed``'s group registry: there,
a default group bound to a device (DeepSpeed binds one) makes a new NCCL group *split* from the default
communicator, which the engines, outside the trainer's default group, can never join.

Collectives are called on the backend object itself (``backend.broadcast([tensor], opts)``), so nothing global in
``torch.distributed`` changes and DeepSpeed's groups are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch

from roll.weights.buckets import BucketMeta, NamedTensors

#: First device of each backend's device map: the prefix torch's group constructor puts before backend keys.
BACKEND_DEVICE = {"nccl": "cuda", "gloo": "cpu"}


def prefixed_store(store: torch.distributed.Store, group_name: str, backend: str) -> torch.distributed.Store:
    """``store`` under the prefixes a group named ``group_name`` reads its keys with (see the module docstring)."""
    from torch.distributed import PrefixStore

    if backend not in BACKEND_DEVICE:
        raise ValueError(f"weight group backend {backend!r}: expected one of {sorted(BACKEND_DEVICE)}")
    return PrefixStore(f"{BACKEND_DEVICE[backend]}/", PrefixStore(f"{group_name}/", PrefixStore(group_name, store)))


def make_backend(
    store: torch.distributed.Store, rank: int, world_size: int, group_name: str, backend: str, timeout: timedelta
) -> torch.distributed.ProcessGroup:
    """A ``ProcessGroupNCCL`` / ``ProcessGroupGloo`` of ``world_size`` ranks over ``store`` (already prefixed)."""
    import torch.distributed as dist

    if backend == "nccl":
        if not dist.is_nccl_available():
            raise RuntimeError("weight group backend nccl: this torch build has no NCCL (CPU build); use gloo")
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = timeout
        if hasattr(opts, "group_name"):  # a log label only (not a store key); absent from older torch
            opts.group_name = group_name
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    else:
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    pg._set_sequence_number_for_group()  # gloo: rank 0 publishes a sequence number the others read (NCCL: no-op)
    return pg


class WeightGroup:
    """This process's member of a weight group: rank ``rank`` of ``world_size``, rank 0 broadcasts.

    Rank 0 starts the TCPStore server on ``master_address:master_port``, so it must be on that host; construction
    returns when all ``world_size`` members have connected to the store (gloo also connects its pairs then; NCCL
    builds its communicator lazily, on the first broadcast). Members construct concurrently.
    """

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
        timeout_s: float = 1800.0,
    ):
        from torch.distributed import TCPStore

        if not 0 <= rank < world_size:
            raise ValueError(f"weight group rank {rank} is outside world_size {world_size}")
        self.rank, self.world_size, self.group_name, self.backend_name = rank, world_size, group_name, backend
        timeout = timedelta(seconds=timeout_s)
        self.store = TCPStore(master_address, int(master_port), world_size, is_master=rank == 0, timeout=timeout)
        self.backend = make_backend(
            prefixed_store(self.store, group_name, backend), rank, world_size, group_name, backend, timeout
        )
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def broadcast(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Broadcast each of ``tensors`` from rank ``src`` in order (in place on the receivers); returns when all
        are done (on CUDA: the current stream is synchronized, so the tensors may be freed afterwards)."""
        import torch.distributed as dist

        works = []
        for tensor in tensors:
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = src, 0
            works.append(self.backend.broadcast([tensor], opts))
        for work in works:
            work.wait()
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()

    def send_bucket(self, bucket: NamedTensors) -> None:
        """Rank 0: broadcast a bucket's tensors in order (receivers post theirs from the bucket's
        :class:`~roll.weights.buckets.BucketMeta`)."""
        tensors = [t if t.is_contiguous() else t.contiguous() for _, t in bucket]
        if any(t.device.type != self.device.type for t in tensors):
            raise ValueError(
                f"weight group {self.group_name!r} ({self.backend_name}) sends {self.device.type} "
                f"tensors; move the bucket to {self.device.type} first"
            )
        self.broadcast(tensors)

    def receive_bucket(self, meta: BucketMeta) -> NamedTensors:
        """Rank > 0: allocate the tensors ``meta`` describes and receive them (what an engine does)."""
        tensors = [
            torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            for dtype, shape in zip(meta.dtypes, meta.shapes)
        ]
        self.broadcast(tensors)
        return list(zip(meta.names, tensors))

    def close(self) -> None:
        """Release the communicator (NCCL) and the store connection."""
        shutdown = getattr(self.backend, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self.backend = None
        self.store = None
