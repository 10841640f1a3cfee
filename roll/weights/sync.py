"""actor_train -> actor_infer weight sync, in the mode placement allows (decided at launch:
:func:`roll.launch.weight_sync.weight_sync` from :func:`roll.distributed.placement.weight_sync_mode`).

The sync drives two sides it sees as Protocols, each spreading its calls over a role's ranks: the trainer's
:class:`Sender` (``TrainProxy.weights_out``, which runs :class:`~roll.weights.sender.WeightSender` methods on every
trainer rank) and the engines' :class:`Receiver` (``RoleProxy.weights_in``, running
:class:`~roll.weights.receiver.WeightReceiver` methods). What travels is decided by the sender alone
(:meth:`roll.weights.sender.WeightSender.buckets`), for every mode below.

``cuda_ipc`` (colocated on GPUs): bucket by bucket, every trainer rank flattens the bucket on its GPU and returns the
CUDA IPC payload of that buffer (:meth:`~roll.weights.sender.WeightSender.share_bucket`; a few hundred bytes); each
inference worker gets, per GPU of its engine, the payload of the trainer rank on that GPU and loads it
(:meth:`~roll.weights.receiver.WeightReceiver.load_bucket`: SGLang's ``flattened_bucket`` format, or views copied
into ``hf_infer``'s parameters). The weights never leave the GPU; only the payloads cross Ray.

``direct`` (``distributed=local``): the receiver loads the trainer's bucket tensors in the same process.

``copy``: every trainer rank takes part in gathering the weights, rank 0 returns them (CPU tensors), and every
inference worker loads them. A CPU Ray run on one machine passes them through a file in ``/dev/shm``
(:mod:`roll.weights.shared_memory`: rank 0 writes, the engines map and load it; no serialization), while it
has room for twice the weights. Otherwise, on Ray, they go from rank 0's result in the object store straight to
the inference workers (the driver passes the object ref and never holds or re-serializes them); in one process,
as a list. The sglang strategy then pushes them
into its engine in buckets with ``update_weights_from_tensor`` (held on the host while its memory is released).

``nccl`` (disaggregated): set up once, on the first sync: trainer rank 0 picks a free port on its node and hosts a
:class:`~roll.weights.group.WeightGroup` (rank 0); every engine joins it through SGLang's
``init_weights_update_group`` (engine ``r`` of TP size ``tp`` at ranks ``1 + r * tp ..``). Every sync: the
trainer's bucket plan (names, dtypes, full shapes; fixed for a run, asked for once) goes to the engines, whose
``update_weights_from_distributed`` calls are started first; then the trainer's broadcast (rank 0 broadcasts
bucket after bucket, the other ranks only join the ZeRO-3 gathers) is started, and both are awaited.
Receivers and sender must be in flight together: each side blocks until the other has posted the same broadcast.

``adapter`` (LoRA, an engine with the ``lora_adapters`` ability): the trainer's adapter alone travels, as CPU copies
under peft's names with its peft config (:meth:`~roll.weights.sender.WeightSender.adapter`), and every engine serves
it on its unchanged base weights (:meth:`~roll.weights.receiver.WeightReceiver.load_adapter`: ``hf_infer`` through
peft, SGLang through ``load_lora_adapter_from_tensors``, from memory). A rank-32 adapter on every linear layer of a
0.5B model is 35 MB, against 0.99 GB of full weights.

Metrics of a sync: ``time/sync`` (the whole call), ``time/sync_push`` (nccl: rank 0's gather + broadcast; copy: the
slowest inference worker's load; cuda_ipc: the receivers' loads), ``sync/buckets``, ``sync/gib`` (weights
sent), ``sync/mode`` (:data:`MODE_IDS`: 0 copy, 1 nccl, 2 cuda_ipc, 3 direct, 4 adapter). The chosen mode and why
(for copy: why no faster path works) is printed once at the first sync.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from roll.weights.buckets import DEFAULT_BUCKET_BYTES, BucketMeta, NamedTensors, tensor_nbytes
from roll.weights.shared_memory import Layout

#: ``sync/mode`` values.
MODE_IDS = {"copy": 0.0, "nccl": 1.0, "cuda_ipc": 2.0, "direct": 3.0, "adapter": 4.0}
#: Name of the weight group (SGLang keeps groups by name).
GROUP_NAME = "roll_weights"


class Sender(Protocol):
    """The trainer's side as the sync sees it: each call runs the :class:`~roll.weights.sender.WeightSender`
    method of the same name on every trainer rank (they gather in step) and answers with rank 0's result, or starts
    them and answers handles for :meth:`wait`."""

    #: whether a started call's handle can be another role's argument (Ray: an object ref, resolved in the callee)
    passes_refs: bool

    def plan(self, bucket_bytes: int) -> list[dict[str, list]]:
        """The bucket plan (``BucketMeta`` dicts) of what the trainer sends, in send order."""
        ...

    def gather(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> NamedTensors:
        """The weights to send as CPU tensors (rank 0's)."""
        ...

    def start_gather(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Any]:
        """:meth:`gather` started on every rank; handles in rank order (rank 0's first)."""
        ...

    def write_shared(self, path: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Layout:
        """The weights written into the new shared-memory file ``path``; their layout."""
        ...

    def adapter(self) -> tuple[NamedTensors, dict]:
        """The LoRA adapter to send: ``(tensors as CPU copies, peft config)`` (rank 0's)."""
        ...

    def start_adapter(self) -> list[Any]:
        """:meth:`adapter` started on every rank; handles in rank order (rank 0's first)."""
        ...

    def buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """Rank 0's generator of device buckets (``direct``: in-process only)."""
        ...

    def share_bucket(self, bucket_bytes: int) -> list[bytes | None]:
        """Every rank's CUDA IPC payload of the next bucket (None after the last), in rank order."""
        ...

    def endpoint(self) -> tuple[str, int]:
        """``(node IP, free port)`` on rank 0's node, where it hosts a weight group."""
        ...

    def host_group(self, host: str, port: int, world_size: int, group_name: str, backend: str) -> list[Any]:
        """Start hosting weight group ``group_name`` (rank 0); handles."""
        ...

    def broadcast(self, bucket_bytes: int, group_name: str) -> list[Any]:
        """Start broadcasting every bucket in ``group_name``; handles whose first result is rank 0's ``seconds`` /
        ``buckets`` / ``bytes``."""
        ...

    def wait(self, handles: list[Any]) -> list[Any]:
        """Results of started calls (of either side), failing fast when one raises."""
        ...


class Receiver(Protocol):
    """The engines' side as the sync sees it: each call runs the :class:`~roll.weights.receiver.WeightReceiver`
    method of the same name on every worker of the role (seconds per worker), or starts it (handles)."""

    world_size: int

    def load(self, named_tensors: Any) -> list[float]:
        """Every worker loads ``(name, tensor)`` pairs (a list, or a handle of :meth:`Sender.start_gather` when the
        sender :attr:`~Sender.passes_refs`)."""
        ...

    def load_shared(self, path: str, layout: Layout) -> list[float]:
        """Every worker loads the weights written to the shared-memory file ``path``."""
        ...

    def load_adapter(self, adapter: Any) -> list[float]:
        """Every worker serves the LoRA adapter ``(tensors, config)`` (or a handle of
        :meth:`Sender.start_adapter` when the sender :attr:`~Sender.passes_refs`)."""
        ...

    def load_bucket(self, per_worker: list[tuple[list[bytes], bool]]) -> list[float]:
        """Worker ``i`` loads the CUDA IPC bucket ``per_worker[i]`` (its payloads, whether it is the last)."""
        ...

    def join_group(
        self, host: str, port: int, ranks_per_worker: int, world_size: int, group_name: str, backend: str
    ) -> list[Any]:
        """Start every worker joining weight group ``group_name`` at ranks ``1 + r * ranks_per_worker ..``."""
        ...

    def receive(self, metas: list[dict[str, list]], group_name: str) -> list[Any]:
        """Start every worker receiving the buckets ``metas`` describes; handles."""
        ...


def copy_weights(sender: Sender, receiver: Receiver, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[float]:
    """Copy the trainer's weights into every worker of ``receiver`` (any role); returns each worker's load seconds.
    Every trainer rank takes part (ZeRO-3 gathers); rank 0's weights are loaded. Between Ray groups the weights
    travel from worker to worker through the object store (one serialization, no stop in the driver)."""
    if sender.passes_refs:
        handles = sender.start_gather(bucket_bytes)
        seconds = receiver.load(handles[0])  # Ray resolves the ref in each receiving worker
        sender.wait(handles)
        return seconds
    return receiver.load(sender.gather(bucket_bytes))


def _free_bytes(directory: str) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


class WeightSync:
    """The actor_train -> actor_infer weight sync of a run; calling it syncs once and returns its metrics."""

    def __init__(
        self,
        sender: Sender,
        receiver: Receiver,
        mode: str,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        engine_tp_size: int = 1,
        backend: str = "nccl",
        count_buckets: bool = False,
        ipc_routes: list[list[int]] | None = None,
        shared_dir: str | None = None,
    ):
        """``engine_tp_size``: weight-group ranks per inference worker; ``backend``: of the weight group (nccl on
        GPU, gloo in CPU tests); ``count_buckets``: report ``sync/buckets`` in copy mode too (sglang's push);
        ``ipc_routes`` (cuda_ipc): for each inference worker, the trainer rank on each of its GPUs, in order;
        ``shared_dir`` (copy, every worker on this machine): the weights go through a file there
        (:mod:`roll.weights.shared_memory`) while it has room for them twice over."""
        if mode not in MODE_IDS:
            raise ValueError(f"weight sync mode {mode!r}: expected one of {sorted(MODE_IDS)}")
        self.sender, self.receiver, self.mode, self.bucket_bytes = sender, receiver, mode, bucket_bytes
        self.engine_tp_size, self.backend, self.count_buckets = engine_tp_size, backend, count_buckets
        self.ipc_routes, self.shared_dir = ipc_routes, shared_dir
        self.metas: list[dict[str, list]] | None = None  # the trainer's bucket plan (copy, nccl, cuda_ipc), asked once
        self.adapter_bytes: int | None = None  # the adapter's size (adapter mode): its shapes never change

    def __call__(self) -> dict[str, float]:
        """Sync once; returns ``time/sync`` and ``sync/*`` metrics (see the module docstring)."""
        start = time.perf_counter()
        sync = {
            "nccl": self._broadcast,
            "cuda_ipc": self._share,
            "direct": self._direct,
            "copy": self._copy,
            "adapter": self._adapter,
        }
        stats = sync[self.mode]()
        return {"time/sync": time.perf_counter() - start, **stats, "sync/mode": MODE_IDS[self.mode]}

    def _share(self) -> dict[str, float]:
        """cuda_ipc: per bucket, every trainer rank shares its GPU's copy; each engine loads the payloads of the
        trainer ranks on its GPUs (see the module docstring). A last call frees the last bucket."""
        if self.metas is None:
            self.metas = self.sender.plan(self.bucket_bytes)
        routes = self.ipc_routes or [[0] * self.engine_tp_size for _ in range(self.receiver.world_size)]
        loading = 0.0
        for k in range(len(self.metas)):
            payloads = self.sender.share_bucket(self.bucket_bytes)
            last = k == len(self.metas) - 1
            seconds = self.receiver.load_bucket([([payloads[t] for t in route], last) for route in routes])
            loading += max(seconds, default=0.0)
        if any(p is not None for p in self.sender.share_bucket(self.bucket_bytes)):
            raise RuntimeError(f"weight sync: the trainer has more weight buckets than its plan ({len(self.metas)})")
        nbytes = sum(BucketMeta(**m).nbytes for m in self.metas)
        return {"time/sync_push": loading, "sync/buckets": float(len(self.metas)), "sync/gib": nbytes / 2**30}

    def _direct(self) -> dict[str, float]:
        """direct: the trainer's device buckets loaded by the receivers in this process (``distributed=local``)."""
        buckets, nbytes, loading = 0, 0, 0.0
        for bucket in self.sender.buckets(self.bucket_bytes):
            loading += max(self.receiver.load(bucket), default=0.0)
            buckets += 1
            nbytes += sum(tensor_nbytes(t) for _, t in bucket)
        return {"time/sync_push": loading, "sync/buckets": float(buckets), "sync/gib": nbytes / 2**30}

    def _copy(self) -> dict[str, float]:
        if self.metas is None:  # sizes and buckets from the trainer's plan (fixed for a run), asked once
            self.metas = self.sender.plan(self.bucket_bytes)
        total = sum(BucketMeta(**m).nbytes for m in self.metas)
        if self.shared_dir and _free_bytes(self.shared_dir) > 2 * total:
            seconds = self._through_shared_memory()
        else:
            seconds = copy_weights(self.sender, self.receiver, self.bucket_bytes)
        stats = {"time/sync_push": max(seconds, default=0.0), "sync/gib": total / 2**30}
        if self.count_buckets:
            stats["sync/buckets"] = float(len(self.metas))
        return stats

    def _adapter(self) -> dict[str, float]:
        """adapter (LoRA): the trainer gathers its adapter (rank 0's CPU copies and peft config) and every engine
        serves it; on Ray it goes from worker to worker through the object store. The base weights never travel."""
        if self.sender.passes_refs:
            handles = self.sender.start_adapter()
            seconds = self.receiver.load_adapter(handles[0])  # the engines resolve rank 0's ref: it is done
            # the other ranks' calls (gathers) must be done too; rank 0's result comes to the driver only to size the
            # first sync (pulling the adapter here every step cost a second copy through the object store)
            done = self.sender.wait(handles if self.adapter_bytes is None else handles[1:])
            tensors = done[0][0] if self.adapter_bytes is None else None
        else:
            tensors, config = self.sender.adapter()
            seconds = self.receiver.load_adapter((tensors, config))
        if tensors is not None:
            self.adapter_bytes = sum(tensor_nbytes(t) for _, t in tensors)
        stats = {"time/sync_push": max(seconds, default=0.0), "sync/buckets": 1.0}
        return {**stats, "sync/gib": (self.adapter_bytes or 0) / 2**30}

    def _through_shared_memory(self) -> list[float]:
        """The trainer writes its weights into a new file in ``shared_dir``, the engines load them from it; the
        file is removed when they are done (or failed)."""
        path = os.path.join(self.shared_dir, f"roll-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            layout = self.sender.write_shared(path, self.bucket_bytes)
            return self.receiver.load_shared(path, layout)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def setup_group(self) -> None:
        """Create the weight group (first nccl sync): engines' joins started first, then the trainer's."""
        host, port = self.sender.endpoint()
        tp, n = self.engine_tp_size, self.receiver.world_size
        world = 1 + n * tp
        joins = self.receiver.join_group(host, port, tp, world, GROUP_NAME, self.backend)
        hosting = self.sender.host_group(host, port, world, GROUP_NAME, self.backend)
        self.sender.wait(hosting + joins)  # one wait: a side that fails is reported, not waited for
        self.metas = self.sender.plan(self.bucket_bytes)
        print(
            f"[roll] weight group {GROUP_NAME!r} up: trainer + {n} engine(s) x TP {tp} = {world} ranks at "
            f"{host}:{port} ({self.backend}), {len(self.metas)} buckets",
            flush=True,
        )

    def _broadcast(self) -> dict[str, float]:
        if self.metas is None:
            self.setup_group()
        receiving = self.receiver.receive(self.metas, GROUP_NAME)
        sending = self.sender.broadcast(self.bucket_bytes, GROUP_NAME)
        sent = self.sender.wait(sending + receiving)[0]  # fails fast if either side raises
        if int(sent["buckets"]) != len(self.metas):
            raise RuntimeError(
                f"weight sync: the trainer sent {sent['buckets']:g} buckets, the engines expected {len(self.metas)}"
            )
        return {"time/sync_push": sent["seconds"], "sync/buckets": sent["buckets"], "sync/gib": sent["bytes"] / 2**30}
