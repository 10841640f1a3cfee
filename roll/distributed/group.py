"""Worker groups: all ranks of one role behind one call interface, over Ray actors or in-process objects.

``call`` runs a method on every rank with the same arguments; ``call_dp`` splits a :class:`Batch` into one chunk
per rank (data parallel) and concatenates the per-rank results in order. A method is named by its
:class:`~roll.distributed.worker.Worker` function (``group.call(Worker.train_step, ...)``, what the typed proxies of
:mod:`roll.distributed.roles` do) or by its name.

``call_async`` / ``call_each_async`` start calls without waiting and return handles for ``wait``: the way to have
two groups' calls in flight at once (a weight broadcast needs the trainer's sender and the engines' receivers
running together). A worker's async calls run one at a time, in the order they were started (a Ray actor has
``max_concurrency=1``; in local mode each worker has one call thread, so do not make a plain ``call`` to a worker
while an async call to it is in flight).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from roll.config.worker import WorkerConfig
from roll.data.batch import Batch
from roll.network import free_port

#: A worker method: the function (``Worker.train_step``) or its name.
Method = str | Callable[..., Any]


def method_name(method: Method) -> str:
    """The name of a worker method given as a function or a name."""
    return method if isinstance(method, str) else method.__name__


@contextlib.contextmanager
def start_notice(role: str, timeout_s: float, every_s: float = 60.0) -> Iterator[None]:
    """Around the start of ``role``'s workers: one line every ``every_s`` seconds while they are still starting
    (naming any stale torch build lock, the known cause of a silent hang), and a timeout error (a Ray group's
    ``rpc_timeout``) that says which role did not start, within how long, and where to look."""
    from roll.strategies.build_locks import find_build_locks

    done, start = threading.Event(), time.monotonic()

    def watch() -> None:
        while not done.wait(every_s):
            stale = " ".join(lock.message() for lock in find_build_locks() if lock.stale)
            print(
                f"[roll] {role}: workers still starting after {time.monotonic() - start:.0f} s (model load, "
                f"process-group rendezvous){'; ' + stale if stale else ''}",
                file=sys.stderr,
                flush=True,
            )

    threading.Thread(target=watch, name=f"roll-start-notice-{role}", daemon=True).start()
    try:
        yield
    except TimeoutError as exc:  # ray's GetTimeoutError is one
        raise TimeoutError(
            f"{role}: workers did not start within rpc_timeout={timeout_s:g} s; their log lines are "
            f"above (Ray prefixes them with the actor's pid); `roll doctor` lists stale build "
            f"locks"
        ) from exc
    finally:
        done.set()


class WorkerGroup(ABC):
    """All workers of one role."""

    role: str
    world_size: int

    @abstractmethod
    def call(self, method: Method, *args: Any, **kwargs: Any) -> list[Any]:
        """``method(*args, **kwargs)`` on every rank; results in rank order."""

    @abstractmethod
    def call_rank0(self, method: Method, *args: Any, **kwargs: Any) -> Any:
        """``method`` on rank 0 only."""

    @abstractmethod
    def call_each(self, method: Method, per_rank_args: list[tuple], **kwargs: Any) -> list[Any]:
        """``method(*per_rank_args[r])`` on rank r, concurrently; results in rank order."""

    @abstractmethod
    def call_each_async(self, method: Method, per_rank_args: dict[int, tuple], **kwargs: Any) -> list[Any]:
        """Start ``method(*per_rank_args[r], **kwargs)`` on each rank ``r`` named, without waiting; handles in the
        order of ``per_rank_args``, for :meth:`wait`."""

    @abstractmethod
    def wait(self, handles: list[Any]) -> list[Any]:
        """Results of calls started by :meth:`call_async` / :meth:`call_each_async`, in the handles' order; an
        error raised by a call is raised here."""

    def call_async(self, method: Method, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method(*args, **kwargs)`` on every rank without waiting; handles in rank order."""
        return self.call_each_async(method, {r: args for r in range(self.world_size)}, **kwargs)

    def call_dp(self, method: Method, batch: Batch, **kwargs: Any) -> list[Any]:
        """``method(chunk_d, **kwargs)`` on every rank of data-parallel replica d, with ``batch`` split into one
        chunk per replica; the results of each replica's collector rank, in replica order. Without model
        parallelism every rank is a replica (chunk r to rank r, every result kept)."""
        layout = self.data_parallel_layout()
        size = layout[0][1]
        chunks = batch.chunk(size)
        results = self.call_each(method, [(chunks[dp],) for dp, _, _ in layout], **kwargs)
        kept = sorted((dp, r) for r, (dp, _, collects) in enumerate(layout) if collects)
        return [results[r] for _, r in kept]

    def data_parallel_layout(self) -> list[tuple[int, int, bool]]:
        """Per rank ``(data-parallel rank, data-parallel size, collects)``, asked once from the initialized
        workers (a megatron role of TP x PP ranks per replica); ``[(r, world_size, True)]`` otherwise."""
        if getattr(self, "_dp_layout", None) is None:
            from roll.distributed.worker import Worker

            self._dp_layout = [tuple(x) for x in self.call(Worker.data_parallel_info)]
        return self._dp_layout


class LocalWorkerGroup(WorkerGroup):
    """Workers in this process (local mode: no Ray); plain stack traces point into user code."""

    def __init__(self, role: str, config: WorkerConfig, num_threads: int | None = None):
        from roll.distributed.worker import Worker

        if config.world_size != 1:
            raise ValueError(f"{role}.world_size={config.world_size}: local mode runs one worker per role")
        self._adopt(role, [Worker(role, config, 0, 1, free_port(), num_threads)])

    @classmethod
    def of(cls, role: str, workers: list[Any]) -> LocalWorkerGroup:
        """A group over worker objects built elsewhere (tests; anything with the called methods)."""
        group = cls.__new__(cls)
        group._adopt(role, list(workers))
        return group

    def _adopt(self, role: str, workers: list[Any]) -> None:
        self.role, self.workers, self.world_size = role, workers, len(workers)
        self._threads: list[ThreadPoolExecutor | None] = [None] * len(workers)
        self._threads_lock = threading.Lock()

    def _thread(self, rank: int) -> ThreadPoolExecutor:
        """Rank ``rank``'s call thread (started on first use): async calls of one worker run one at a time."""
        with self._threads_lock:
            if self._threads[rank] is None:
                self._threads[rank] = ThreadPoolExecutor(1, thread_name_prefix=f"roll-{self.role}-{rank}")
            return self._threads[rank]

    def call(self, method: Method, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(w, method_name(method))(*args, **kwargs) for w in self.workers]

    def call_rank0(self, method: Method, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.workers[0], method_name(method))(*args, **kwargs)

    def call_each(self, method: Method, per_rank_args: list[tuple], **kwargs: Any) -> list[Any]:
        return [getattr(w, method_name(method))(*a, **kwargs) for w, a in zip(self.workers, per_rank_args)]

    def call_each_async(self, method: Method, per_rank_args: dict[int, tuple], **kwargs: Any) -> list[Future]:
        return [
            self._thread(r).submit(getattr(self.workers[r], method_name(method)), *a, **kwargs)
            for r, a in per_rank_args.items()
        ]

    def wait(self, handles: list[Future]) -> list[Any]:
        """Fail fast, like :meth:`RayWorkerGroup.wait`."""
        for h in wait_futures(handles, return_when=FIRST_EXCEPTION).done:
            if h.exception() is not None:
                raise h.exception()
        return [h.result() for h in handles]


class RayWorkerGroup(WorkerGroup):
    """``world_size`` Ray actors of :class:`Worker`, each reserving ``num_cpus_per_worker`` CPUs (and GPUs)."""

    def __init__(
        self,
        role: str,
        config: WorkerConfig,
        timeout_s: float,
        gpu_ids: list[int] | None = None,
        slots: list | None = None,
        placement_groups: dict[str, Any] | None = None,
    ):
        """Without ``slots``: plain actors. With ``slots`` (from :func:`roll.distributed.placement.plan_placement`)
        and their ``placement_groups``: each actor in its bundle, seeing exactly its GPUs."""
        import ray

        from roll.distributed.worker import Worker

        self.role, self.world_size, self.timeout_s = role, config.world_size, timeout_s
        port = free_port()
        num_gpus = config.num_gpus_per_worker if gpu_ids else 0
        threads = max(1, int(config.num_cpus_per_worker))
        actor_cls = ray.remote(Worker)
        if slots is not None:
            self.world_size = len(slots)
            self.actors = [
                actor_cls.options(max_concurrency=1, **_slot_options(s, placement_groups)).remote(
                    role, config, s.rank, self.world_size, port, threads
                )
                for s in slots
            ]
            return
        self.actors = [
            actor_cls.options(
                num_cpus=config.num_cpus_per_worker, num_gpus=num_gpus, name=None, max_concurrency=1
            ).remote(role, config, rank, self.world_size, port, threads)
            for rank in range(self.world_size)
        ]

    def _get(self, refs: Any) -> Any:
        import ray

        return ray.get(refs, timeout=self.timeout_s)

    def call(self, method: Method, *args: Any, **kwargs: Any) -> list[Any]:
        return self._get([getattr(a, method_name(method)).remote(*args, **kwargs) for a in self.actors])

    def call_each_async(self, method: Method, per_rank_args: dict[int, tuple], **kwargs: Any) -> list[Any]:
        return [getattr(self.actors[r], method_name(method)).remote(*a, **kwargs) for r, a in per_rank_args.items()]

    def wait(self, handles: list[Any]) -> list[Any]:
        """Fail fast: the first call to raise is raised at once, even while others (which may be blocked
        waiting for it, e.g. the other side of a broadcast) are still running."""
        import ray

        pending = list(handles)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=self.timeout_s)
            if not done:
                raise TimeoutError(f"{self.role}: {len(pending)} call(s) still running after {self.timeout_s:g} s")
            ray.get(done)
        return self._get(list(handles))

    def call_rank0(self, method: Method, *args: Any, **kwargs: Any) -> Any:
        return self._get(getattr(self.actors[0], method_name(method)).remote(*args, **kwargs))

    def call_each(self, method: Method, per_rank_args: list[tuple], **kwargs: Any) -> list[Any]:
        return self._get(
            [getattr(a, method_name(method)).remote(*args, **kwargs) for a, args in zip(self.actors, per_rank_args)]
        )

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)


def _slot_options(slot: Any, placement_groups: dict[str, Any]) -> dict[str, Any]:
    """Ray actor options for one :class:`~roll.distributed.placement.WorkerSlot`: its bundle, its resources and,
    on GPU, the slot's node-local GPU indices, which the worker turns into its ``CUDA_VISIBLE_DEVICES`` before
    touching CUDA (:func:`~roll.distributed.placement.visible_devices`; Ray told not to overwrite it).

    GPU workers also get ``NCCL_CUMEM_ENABLE=0`` unless the driver sets it: each sees only its own GPUs, and NCCL's
    cuMem peer-to-peer path then fails between them ("Cuda failure 'invalid argument'", measured on 2 H200s in the
    disaggregated weight group); the legacy path works."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from roll.distributed.placement import LOCAL_GPUS, NOSET_CUDA

    options: dict[str, Any] = {
        "num_cpus": slot.num_cpus,
        "num_gpus": slot.num_gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=placement_groups[slot.group_key], placement_group_bundle_index=slot.bundle
        ),
    }
    if slot.gpu_ids:
        env = dict((ray.get_runtime_context().runtime_env or {}).get("env_vars", {}))
        env.update({NOSET_CUDA: "1", LOCAL_GPUS: ",".join(map(str, slot.local_gpu_ids))})
        env.setdefault("NCCL_CUMEM_ENABLE", os.environ.get("NCCL_CUMEM_ENABLE", "0"))
        options["runtime_env"] = {"env_vars": env}
    return options
