"""A worker: one rank of one role, holding one strategy. Runs as a Ray actor or in-process (local mode).

What the strategy must implement is its registry entry's contract (:mod:`roll.strategies.registry`): the base
class of its role and the Protocols of its declared abilities, checked when the class is resolved. The forwarders
below call the strategy's declared methods directly; an ability is read from the entry, never probed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.data.batch import Batch
from roll.distributed.network import free_port, node_ip
from roll.distributed.placement import LOCAL_GPUS, visible_devices
from roll.strategies.base import GenerationOutput, StrategyContext
from roll.strategies.registry import get_strategy_class, strategy_spec
from roll.weights.buckets import tensor_nbytes
from roll.weights.group import WeightGroup


class Worker:
    """Role ``role``, rank ``rank`` of ``world_size``; forwards calls to its strategy and times them."""

    def __init__(
        self,
        role: str,
        config: WorkerConfig,
        rank: int,
        world_size: int,
        master_port: int,
        num_threads: int | None = None,
    ):
        if os.environ.get(LOCAL_GPUS) is not None:  # a GPU slot's actor: pick its GPUs before CUDA starts
            os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices(
                os.environ.pop(LOCAL_GPUS), os.environ.get("CUDA_VISIBLE_DEVICES")
            )
        os.environ.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port),
                "RANK": str(rank),
                "LOCAL_RANK": "0" if not torch.cuda.is_available() else os.environ.get("LOCAL_RANK", "0"),
                "WORLD_SIZE": str(world_size),
            }
        )
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.role, self.rank, self.world_size = role, rank, world_size
        name = config.strategy_args.strategy_name
        self.spec = strategy_spec(name)
        self.strategy = get_strategy_class(name, role)(config, rank, world_size)  # contract checked there
        self.weight_groups: dict[str, WeightGroup] = {}  # sender side of weight groups (train rank 0)
        # generation and weight loading take turns (in local mode they come from different threads): a weight
        # update waits for the generate call in progress, so it lands between turns and discards no token
        self._turns = threading.Lock()
        self.policy_version = 0  # the driver's count of weight syncs (roll.rollout.buffer), set after each
        self._request_versions: dict[str, int] = {}  # submitted request -> the version it started under

    def initialize(self, ctx: StrategyContext) -> float:
        """Build the strategy; returns seconds taken."""
        start = time.perf_counter()
        self.strategy.initialize(ctx)
        return time.perf_counter() - start

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        with self._turns:
            version = self.policy_version
            outputs = self.strategy.generate(prompts, args, max_new_tokens)
        for out in outputs:
            out.policy_version = version
        return outputs

    def set_policy_version(self, version: int) -> None:
        """The driver's weight-sync count, after a sync: outputs started from now on carry it. A label is never
        newer than the weights that made the tokens (set after the weights are in)."""
        with self._turns:
            self.policy_version = version

    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        return self.strategy.compute_log_probs(batch, with_entropy)

    def compute_base_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The base model's log-probs: actor_train with its LoRA adapters off (reference log-probs)."""
        return self.strategy.compute_base_log_probs(batch)

    def data_parallel_info(self) -> tuple[int, int, bool]:
        """``(data-parallel rank, data-parallel size, whether this rank's results are kept)`` for ``call_dp``
        (:meth:`roll.strategies.base.Strategy.data_parallel_info`)."""
        return self.strategy.data_parallel_info()

    def compute_values(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Critic values ``{"values": (B, L-1)}`` (the critic role)."""
        return self.strategy.compute_values(batch)

    def train_step(
        self,
        batch: Batch,
        loss_fn: Callable,
        lr: float | None = None,
        with_entropy: bool = False,
        return_log_probs: bool = False,
    ) -> dict[str, Any]:
        return self.strategy.train_step(batch, loss_fn, lr, with_entropy, return_log_probs)

    def reset_optimizer(self) -> None:
        self.strategy.reset_optimizer()

    def profile_train_step(self, batch: Batch, loss_fn: Callable, rows: int = 25, **kwargs: Any) -> str:
        """One ``train_step`` under ``torch.profiler``: the table of the ``rows`` most expensive operations (by
        device time on GPU, CPU time otherwise), for ``benchmarks/gpu_step.py --profile``."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            self.strategy.train_step(batch, loss_fn, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        return prof.key_averages().table(sort_by=key, row_limit=rows)

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.strategy.named_weights())

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> float:
        start = time.perf_counter()
        with self._turns:
            self.strategy.load_weights(named_tensors)
        return time.perf_counter() - start

    # ------------------------------------------------------------------ copy through shared memory (one machine)
    def write_shared_weights(self, path: str) -> list | None:
        """Every rank takes part in gathering; rank 0 writes the weights into the new file ``path`` and returns
        their layout (:func:`roll.weights.shared_memory.write_shared`), the others None."""
        from roll.weights.shared_memory import write_shared

        weights = list(self.strategy.named_weights())
        return write_shared(path, weights) if weights else None

    def load_shared_weights(self, path: str, layout: list) -> float:
        """Load the weights another worker wrote to ``path``; returns seconds."""
        from roll.weights.shared_memory import read_shared

        return self.load_weights(read_shared(path, layout))

    # ------------------------------------------------------------------ zero-copy sync (CUDA IPC, colocated)
    def share_weight_bucket(self, bucket_bytes: int) -> bytes | None:
        """The CUDA IPC payload of the next weight bucket (:mod:`roll.weights.ipc`), or None after the
        last. Every rank of the role calls in step (ZeRO-3 gathers each bucket collectively); each shares its own
        GPU's copy and keeps it alive until its next call."""
        from roll.weights.ipc import share_bucket

        if getattr(self, "_ipc_buckets", None) is None:
            self._ipc_buckets = iter(self.strategy.weight_buckets(bucket_bytes))
        self._ipc_buffer = None  # the previous bucket's receivers are done
        bucket = next(self._ipc_buckets, None)
        if bucket is None:
            self._ipc_buckets = None
            return None
        payload, self._ipc_buffer = share_bucket(bucket)
        return payload

    def weight_buckets(self, bucket_bytes: int):
        """The strategy's generator of device weight buckets (``direct`` sync, in-process only: under Ray a
        generator does not cross processes)."""
        return self.strategy.weight_buckets(bucket_bytes)

    def load_weight_bucket(self, payloads: list[bytes], flush: bool) -> float:
        """Load one shared bucket (one payload per GPU of this worker, in its GPU order); returns seconds."""
        self._needs("ipc_weights", "load CUDA IPC weight buckets")
        start = time.perf_counter()
        with self._turns:
            self.strategy.load_weight_bucket(payloads, flush)
        return time.perf_counter() - start

    def _needs(self, ability: str, purpose: str) -> None:
        """A TypeError naming the strategy when its registry entry does not declare ``ability``."""
        if not self.spec.can(ability):
            raise TypeError(
                f"{self.role}: strategy {self.spec.name!r} cannot {purpose} (its registry entry "
                f"declares no {ability!r} ability)"
            )

    # ------------------------------------------------------------------ per-request generation (ability "submit")
    def submit(
        self, requests: list[tuple[str, list[int]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[str]:
        """Queue ``(rid, prompt ids)`` requests on the engine; returns the engine's request ids."""
        self._needs("submit", "take single requests")
        sent = self.strategy.submit(requests, args, max_new_tokens)
        self._request_versions.update(dict.fromkeys(sent, self.policy_version))  # the engine's ids (rid#k for n > 1)
        return sent

    def poll(self, rids: list[str] | None = None, timeout: float | None = 0.05) -> dict[str, GenerationOutput]:
        """Finished requests among ``rids``, waiting at most ``timeout`` s for the first one; each carries the
        policy version it was submitted under (the oldest of its tokens)."""
        done = self.strategy.poll(rids, timeout)
        for rid, out in done.items():
            out.policy_version = self._request_versions.pop(rid, self.policy_version)
        return done

    def abort(self, rids: list[str] | None = None) -> list[str]:
        """Abort requests in flight (``None``: all); returns the aborted ids."""
        aborted = self.strategy.abort(rids)
        for rid in aborted:
            self._request_versions.pop(rid, None)
        return aborted

    # ------------------------------------------------------------------ weight groups (disaggregated sync)
    def weight_group_endpoint(self) -> tuple[str, int]:
        """``(node IP, free port)`` on this worker's node, for a weight group this worker hosts (rank 0)."""
        host = node_ip()
        return host, free_port(host)

    def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
    ) -> None:
        """Join weight group ``group_name``. A receiving strategy (sglang) joins through its engine at
        ``rank_offset``; a training strategy's rank 0 is the sender (``rank_offset`` 0) and hosts the store, its
        other ranks take no part. Blocks until all ``world_size`` members joined: start the members together."""
        if self.spec.can("weight_group"):
            self.strategy.init_weight_group(master_address, master_port, rank_offset, world_size, group_name, backend)
            return
        if self.role != "actor_train":
            raise TypeError(
                f"{self.role}: strategy {self.spec.name!r} can neither send weights by broadcast (only "
                f"actor_train does) nor receive them (no 'weight_group' ability)"
            )
        if self.rank == 0:
            if group_name in self.weight_groups:
                raise RuntimeError(f"{self.role}: weight group {group_name!r} is already set up")
            self.weight_groups[group_name] = WeightGroup(
                master_address, master_port, rank_offset, world_size, group_name, backend
            )

    def weight_bucket_metas(self, bucket_bytes: int) -> list[dict[str, list]]:
        """The sender's bucket plan (``BucketMeta`` as dicts): what receivers allocate, in broadcast order."""
        return [m.to_dict() for m in self.strategy.weight_bucket_metas(bucket_bytes)]

    def broadcast_weights(self, bucket_bytes: int, group_name: str) -> dict[str, float]:
        """Rank 0 broadcasts every bucket of :meth:`weight_bucket_metas` in ``group_name``; every rank must call
        (ZeRO-3 gathers each bucket collectively). Returns ``seconds``, ``buckets`` and ``bytes`` sent."""
        start, buckets, nbytes = time.perf_counter(), 0, 0
        group = self.weight_groups.get(group_name)
        if self.rank == 0 and group is None:
            raise RuntimeError(f"{self.role}: no weight group {group_name!r}; call init_weight_group first")
        for bucket in self.strategy.weight_buckets(bucket_bytes):
            if group is not None:
                group.send_bucket(bucket)
            buckets += 1
            nbytes += sum(tensor_nbytes(t) for _, t in bucket)
        return {"seconds": time.perf_counter() - start, "buckets": float(buckets), "bytes": float(nbytes)}

    def update_weights_distributed(self, metas: list[dict[str, list]], group_name: str) -> float:
        """Receive the buckets ``metas`` describes from the group's rank 0; returns seconds."""
        self._needs("weight_group", "receive weights by broadcast")
        with self._turns:
            return self.strategy.update_weights_distributed(metas, group_name)

    def save_pretrained(self, path: str) -> None:
        self.strategy.save_pretrained(path)

    def save_checkpoint(self, path: str) -> None:
        self.strategy.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.strategy.load_checkpoint(path)

    def offload_states(self) -> None:
        self.strategy.offload_states()

    def reload_states(self) -> None:
        self.strategy.reload_states()

    def rng_state(self) -> dict[str, Any]:
        """This process's RNG states (python, numpy, torch CPU and CUDA), for checkpoints."""
        return get_rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned."""
        set_rng_state(state)

    def memory_stats(self) -> dict[str, float]:
        """CUDA memory in GiB (``{}`` on CPU): this process's peak allocated and reserved since start, what it
        reserves now, and the GPU's use by all processes and its total."""
        if not torch.cuda.is_available():
            return {}
        free, total = torch.cuda.mem_get_info()
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30,
            "gpu_used_gib": (total - free) / 2**30,
            "gpu_total_gib": total / 2**30,
        }

    def ping(self) -> Any:
        return self.role, self.rank, os.getpid()

    def location(self) -> str:
        """Where this worker runs: its Ray node (id prefix and IP) and its GPUs, for the startup log."""
        import ray

        node = ray.get_runtime_context().get_node_id()[:8] if ray.is_initialized() else "local"
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES") if torch.cuda.is_available() else None
        return f"node {node} ({node_ip()})" + (f", GPU {gpus}" if gpus else "")


def get_rng_state() -> dict[str, Any]:
    """RNG states of this process: ``{"python", "numpy", "torch", "cuda" (list per device, GPU only)}``."""
    import random

    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from :func:`get_rng_state` (the CUDA part only where this process has GPUs)."""
    import random

    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
