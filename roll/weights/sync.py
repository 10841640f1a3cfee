"""actor_train -> actor_infer weight sync, in the mode placement allows (see
:func:`roll.distributed.placement.weight_sync_mode`).

``cuda_ipc`` (colocated on GPUs): bucket by bucket, every trainer rank flattens the bucket on its GPU and returns the
CUDA IPC payload of that buffer (:meth:`~roll.distributed.worker.Worker.share_weight_bucket`; a few hundred bytes);
each inference worker gets, per GPU of its engine, the payload of the trainer rank on that GPU and loads it
(:meth:`~roll.distributed.worker.Worker.load_weight_bucket`: SGLang's ``flattened_bucket`` format, or views copied
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
``update_weights_from_distributed`` calls are started first; then the trainer's ``broadcast_weights`` (rank 0
broadcasts bucket after bucket, the other ranks only join the ZeRO-3 gathers) is started, and both are awaited.
Receivers and sender must be in flight together: each side blocks until the other has posted the same broadcast.

Metrics of a sync: ``time/sync`` (the whole call), ``time/sync_push`` (nccl: rank 0's gather + broadcast; copy: the
slowest inference worker's ``load_weights``; cuda_ipc: the receivers' loads), ``sync/buckets``, ``sync/gib`` (weights
sent), ``sync/mode`` (:data:`MODE_IDS`: 0 copy, 1 nccl, 2 cuda_ipc, 3 direct). The chosen mode and why (for copy:
why no faster path works) is printed once at the first sync.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any

from roll.distributed.group import RayWorkerGroup
from roll.distributed.roles import InferProxy, RoleProxy, TrainProxy
from roll.weights.buckets import DEFAULT_BUCKET_BYTES, BucketMeta, tensor_nbytes


def ipc_routes(mappings: dict[str, list[int]], gpus_per_infer_worker: int) -> list[list[int]]:
    """For each actor_infer worker, the actor_train rank on each of its GPUs (in the worker's GPU order); empty
    on CPU. Trainer rank r runs on ``actor_train.device_mapping[r]``."""
    train, infer = list(mappings.get("actor_train") or []), list(mappings.get("actor_infer") or [])
    rank_of = {gpu: rank for rank, gpu in enumerate(train)}
    k = max(1, gpus_per_infer_worker)
    return [[rank_of.get(g, 0) for g in infer[i : i + k]] for i in range(0, len(infer), k)]


#: ``sync/mode`` values.
MODE_IDS = {"copy": 0.0, "nccl": 1.0, "cuda_ipc": 2.0, "direct": 3.0}
#: Name of the weight group (SGLang keeps groups by name).
GROUP_NAME = "roll_weights"


def copy_weights(train: TrainProxy, target: RoleProxy) -> list[float]:
    """Copy actor_train's weights into every worker of ``target`` (any role: ``load_weights``); returns each
    worker's ``load_weights`` seconds. Every trainer rank takes part (ZeRO-3 gathers); rank 0's weights are loaded.
    Between Ray groups the weights travel from worker to worker through the object store (one serialization, no
    stop in the driver)."""
    if isinstance(train.group, RayWorkerGroup) and isinstance(target.group, RayWorkerGroup):
        handles = train.start_named_weights()
        seconds = target.load_weights(handles[0])  # Ray resolves the ref in each target worker
        train.wait(handles)
        return seconds
    return target.load_weights(train.named_weights())


#: Where a CPU run on one machine passes the weights (``copy`` mode): a RAM-backed file system.
SHARED_DIR = "/dev/shm"


def _free_bytes(directory: str) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


class WeightSync:
    """The actor_train -> actor_infer weight sync of a run; calling it syncs once and returns its metrics."""

    def __init__(
        self,
        train: TrainProxy,
        infer: InferProxy,
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
        self.train, self.infer, self.mode, self.bucket_bytes = train, infer, mode, bucket_bytes
        self.engine_tp_size, self.backend, self.count_buckets = engine_tp_size, backend, count_buckets
        self.ipc_routes, self.shared_dir = ipc_routes, shared_dir
        self.metas: list[dict[str, list]] | None = None  # the trainer's bucket plan (nccl, cuda_ipc), asked once

    @classmethod
    def from_config(cls, cfg: Any, train: TrainProxy, infer: InferProxy) -> WeightSync:
        """The sync ``cfg`` asks for: mode from placement (and sglang's ``weight_sync`` key), bucket size and TP
        size from actor_infer's ``strategy_config``. Prints the mode and why."""
        from roll.distributed.placement import role_mappings, weight_sync_mode
        from roll.strategies.registry import get_strategy_class, strategy_options, strategy_spec

        ic = cfg.actor_infer
        spec = strategy_spec(ic.strategy_args.strategy_name)
        options = strategy_options(ic, "actor_infer.strategy_args.strategy_config")
        receives = spec.can("weight_group")
        mappings = role_mappings(cfg)
        requested = options.weight_sync if receives else "auto"  # only a weight-group receiver has the choice
        mode, why = weight_sync_mode(
            mappings,
            cfg.distributed,
            receives,
            requested,
            infer_supports_ipc=spec.can("ipc_weights"),
            infer_in_subprocess=receives,
        )
        tp = get_strategy_class(spec.name, "actor_infer").weight_group_ranks(ic) if receives else 1
        one_machine = cfg.distributed == "ray" and not cfg.ray_address and not any(mappings.values())
        shared = SHARED_DIR if mode == "copy" and one_machine and os.path.isdir(SHARED_DIR) else None
        how = f", through shared memory in {shared}: a CPU run on one machine" if shared else ""
        print(f"[roll] weight sync actor_train -> actor_infer: {mode} ({why}{how})", flush=True)
        return cls(
            train,
            infer,
            mode,
            options.weight_bucket_bytes,
            tp,
            count_buckets=receives,
            ipc_routes=ipc_routes(mappings, ic.num_gpus_per_worker),
            shared_dir=shared,
        )

    def __call__(self) -> dict[str, float]:
        """Sync once; returns ``time/sync`` and ``sync/*`` metrics (see the module docstring)."""
        start = time.perf_counter()
        sync = {"nccl": self._broadcast, "cuda_ipc": self._share, "direct": self._direct, "copy": self._copy}
        stats = sync[self.mode]()
        return {"time/sync": time.perf_counter() - start, **stats, "sync/mode": MODE_IDS[self.mode]}

    def _share(self) -> dict[str, float]:
        """cuda_ipc: per bucket, every trainer rank shares its GPU's copy; each engine loads the payloads of the
        trainer ranks on its GPUs (see the module docstring). A last call frees the last bucket."""
        if self.metas is None:
            self.metas = self.train.weight_bucket_metas(self.bucket_bytes)
        routes = self.ipc_routes or [[0] * self.engine_tp_size for _ in range(self.infer.world_size)]
        loading = 0.0
        for k in range(len(self.metas)):
            payloads = self.train.share_weight_bucket(self.bucket_bytes)
            last = k == len(self.metas) - 1
            seconds = self.infer.load_weight_bucket([([payloads[t] for t in route], last) for route in routes])
            loading += max(seconds, default=0.0)
        if any(p is not None for p in self.train.share_weight_bucket(self.bucket_bytes)):
            raise RuntimeError(f"weight sync: the trainer has more weight buckets than its plan ({len(self.metas)})")
        nbytes = sum(BucketMeta(**m).nbytes for m in self.metas)
        return {"time/sync_push": loading, "sync/buckets": float(len(self.metas)), "sync/gib": nbytes / 2**30}

    def _direct(self) -> dict[str, float]:
        """direct: the trainer's device buckets loaded by the receivers in this process (``distributed=local``)."""
        buckets, nbytes, loading = 0, 0, 0.0
        for bucket in self.train.device_weight_buckets(self.bucket_bytes):
            loading += max(self.infer.load_weights(bucket), default=0.0)
            buckets += 1
            nbytes += sum(tensor_nbytes(t) for _, t in bucket)
        return {"time/sync_push": loading, "sync/buckets": float(buckets), "sync/gib": nbytes / 2**30}

    def _copy(self) -> dict[str, float]:
        if self.metas is None:  # sizes and buckets from the trainer's plan (fixed for a run), asked once
            self.metas = self.train.weight_bucket_metas(self.bucket_bytes)
        total = sum(BucketMeta(**m).nbytes for m in self.metas)
        if self.shared_dir and _free_bytes(self.shared_dir) > 2 * total:
            seconds = self._through_shared_memory()
        else:
            seconds = copy_weights(self.train, self.infer)
        stats = {"time/sync_push": max(seconds, default=0.0), "sync/gib": total / 2**30}
        if self.count_buckets:
            stats["sync/buckets"] = float(len(self.metas))
        return stats

    def _through_shared_memory(self) -> list[float]:
        """The trainer writes its weights into a new file in ``shared_dir``, the engines load them from it; the
        file is removed when they are done (or failed)."""
        path = os.path.join(self.shared_dir, f"roll-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            layout = self.train.write_shared_weights(path)
            return self.infer.load_shared_weights(path, layout)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def setup_group(self) -> None:
        """Create the weight group (first nccl sync): engines' joins started first, then the trainer's."""
        host, port = self.train.weight_group_endpoint()
        tp, n = self.engine_tp_size, self.infer.world_size
        world = 1 + n * tp
        joins = self.infer.join_weight_group(host, port, tp, world, GROUP_NAME, self.backend)
        hosting = self.train.host_weight_group(host, port, world, GROUP_NAME, self.backend)
        self.train.wait(hosting + joins)  # one wait: a side that fails is reported, not waited for
        self.metas = self.train.weight_bucket_metas(self.bucket_bytes)
        print(
            f"[roll] weight group {GROUP_NAME!r} up: trainer + {n} engine(s) x TP {tp} = {world} ranks at "
            f"{host}:{port} ({self.backend}), {len(self.metas)} buckets",
            flush=True,
        )

    def _broadcast(self) -> dict[str, float]:
        if self.metas is None:
            self.setup_group()
        receiving = self.infer.receive_weights(self.metas, GROUP_NAME)
        sending = self.train.broadcast_weights(self.bucket_bytes, GROUP_NAME)
        sent = self.train.wait(sending + receiving)[0]  # fails fast if either side raises
        if int(sent["buckets"]) != len(self.metas):
            raise RuntimeError(
                f"weight sync: the trainer sent {sent['buckets']:g} buckets, the engines expected {len(self.metas)}"
            )
        return {"time/sync_push": sent["seconds"], "sync/buckets": sent["buckets"], "sync/gib": sent["bytes"] / 2**30}
