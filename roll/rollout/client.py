"""Generation clients: how a caller (an env manager, the gateway, the RLVR pipeline) reaches the inference role.

One protocol for every caller (:class:`GenerationClient`): ``submit`` requests, ``poll`` for the finished ones,
``abort`` the rest, ``leave`` when done; ``generate`` is the batch form (submit all, poll until done). Env managers
use submit/poll; the RLVR pipeline uses ``generate``.

Two clients implement it over the inference role (:func:`generation_client` picks one): :class:`SubmitClient`
sends each request to an engine that takes requests one at a time (strategy ability ``submit``: SGLang's continuous
batching batches what is in flight); :class:`BatchClient` keeps submitted requests until ``poll`` and then generates
all of them in one batch call per sampling setting, through a :class:`GenerationBackend`: :class:`RoleBackend` (the
role's workers, one chunk per rank) or a :class:`~roll.rollout.batcher.DynamicBatcher` (requests of several env
managers merged into one generate call).
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections import defaultdict
from typing import Any, Protocol

from roll.config.agentic import AgenticConfig
from roll.config.worker import GeneratingArgs
from roll.distributed.roles import InferProxy
from roll.strategies.base import GenerationOutput


class GenerationBackend(Protocol):
    """Anything that turns a batch of prompts (token ids) into generations, in prompt order."""

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]: ...

    def leave(self) -> None:
        """The calling client has finished its rollout (a batcher stops waiting for it)."""


class GenerationClient(GenerationBackend, Protocol):
    """The generation protocol of every caller: requests ``(rid, prompt ids)`` in, finished outputs by rid out."""

    def submit(
        self, requests: list[tuple[str, list[int]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> None:
        """Queue requests; ``rid`` must be unique among the requests in flight."""

    def poll(self, rids: list[str]) -> dict[str, GenerationOutput]:
        """Finished requests among ``rids`` (at least one unless none can finish), in the order of ``rids``."""

    def abort(self, rids: list[str]) -> None:
        """Drop requests still in flight."""


class RoleBackend:
    """Sends a list of prompts to the inference role as one chunk per rank (data parallel)."""

    def __init__(self, infer: InferProxy):
        self.infer = infer

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        return self.infer.generate(prompts, args, max_new_tokens)

    def leave(self) -> None:
        """Nothing to do: requests go straight through."""


class BatchClient:
    """:class:`GenerationClient` over a batch generator: ``submit`` queues; ``poll`` generates every queued request, one
    ``inner.generate`` call per (sampling settings, token budget) in the order they were first submitted, with the
    prompts in submission order."""

    def __init__(self, inner: GenerationBackend):
        self.inner = inner
        self._queued: list[tuple[str, list[int], GeneratingArgs, int | None]] = []
        self._done: dict[str, GenerationOutput] = {}

    def __getstate__(self) -> dict[str, Any]:  # sent to Ray env managers between rollouts: nothing in flight
        return {"inner": self.inner, "_queued": [], "_done": {}}

    def submit(
        self, requests: list[tuple[str, list[int]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> None:
        self._queued += [(rid, prompt, args, max_new_tokens) for rid, prompt in requests]

    def poll(self, rids: list[str]) -> dict[str, GenerationOutput]:
        keys: dict[tuple[str, int | None], list[tuple[str, list[int], GeneratingArgs, int | None]]] = {}
        for request in self._queued:
            keys.setdefault((repr(request[2]), request[3]), []).append(request)
        self._queued = []
        for batch in keys.values():
            outputs = self.inner.generate([prompt for _, prompt, _, _ in batch], batch[0][2], batch[0][3])
            self._done.update({rid: out for (rid, *_), out in zip(batch, outputs)})
        return {rid: self._done.pop(rid) for rid in rids if rid in self._done}

    def abort(self, rids: list[str]) -> None:
        dropped = set(rids)
        self._queued = [r for r in self._queued if r[0] not in dropped]
        for rid in dropped:
            self._done.pop(rid, None)

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        """The batch form: one ``inner.generate`` call."""
        return self.inner.generate(prompts, args, max_new_tokens)

    def leave(self) -> None:
        self.inner.leave()


class SubmitClient:
    """A :class:`~roll.rollout.client.GenerationClient` that sends each request on its own to an inference role whose
    strategy declares the ``submit`` ability (SGLang: its continuous batching batches whatever is in flight).

    Request ``rid`` goes to rank ``crc32(rid before '/') % world_size``, so every turn of one trajectory (``rid`` =
    ``"{traj_id}/turn{k}"``) lands on the same engine and reuses its prefix cache. The calls go to all ranks involved
    at once (:class:`~roll.distributed.roles.InferProxy`).
    """

    def __init__(self, infer: InferProxy, poll_timeout_s: float = 0.2):

        self.infer, self.poll_timeout_s = infer, poll_timeout_s
        self._lock = threading.Lock()  # local mode: manager threads share this client and one engine
        self._rank_of: dict[str, int] = {}

    @staticmethod
    def supported(cfg: AgenticConfig) -> bool:
        """Whether ``actor_infer``'s strategy declares the ``submit`` ability (in the strategy registry)."""
        from roll.strategies.registry import strategy_spec

        return strategy_spec(cfg.actor_infer.strategy_args.strategy_name).can("submit")

    def __getstate__(self) -> dict[str, Any]:  # sent to Ray env managers: the lock stays behind
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:

        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _rank(self, rid: str) -> int:

        return zlib.crc32(rid.split("/", 1)[0].encode()) % self.infer.world_size

    def submit(self, requests: list[tuple[str, list[int]]], args: Any, max_new_tokens: int | None = None) -> None:
        """Queue ``(rid, prompt ids)`` requests (one sample each: agentic turns use ``num_return_sequences=1``)."""
        by_rank: dict[int, list] = defaultdict(list)
        for rid, prompt in requests:
            self._rank_of[rid] = self._rank(rid)
            by_rank[self._rank_of[rid]].append((rid, prompt))
        with self._lock:
            self.infer.submit(dict(by_rank), args, max_new_tokens)

    def poll(self, rids: list[str]) -> dict[str, Any]:
        """Finished requests among ``rids`` (waits up to ``poll_timeout_s`` for the first on each rank)."""
        by_rank: dict[int, list[str]] = defaultdict(list)
        for rid in rids:
            by_rank[self._rank_of[rid]].append(rid)
        with self._lock:
            done = self.infer.poll(dict(by_rank), self.poll_timeout_s)
        for rid in done:
            self._rank_of.pop(rid, None)
        return done

    def abort(self, rids: list[str]) -> None:
        """Abort requests still in flight."""
        by_rank: dict[int, list[str]] = defaultdict(list)
        for rid in rids:
            if rid in self._rank_of:
                by_rank[self._rank_of.pop(rid)].append(rid)
        with self._lock:
            self.infer.abort(dict(by_rank))

    def generate(self, prompts: list[list[int]], args: Any, max_new_tokens: int | None = None) -> list[Any]:
        """Batch form: every prompt as its own request, results in prompt order."""

        base = f"batch-{os.getpid()}-{time.monotonic_ns()}"  # unique among this engine's requests
        rids = [f"{base}-{i}" for i in range(len(prompts))]
        self.submit(list(zip(rids, prompts)), args, max_new_tokens)
        done: dict[str, Any] = {}
        while len(done) < len(rids):
            done.update(self.poll([r for r in rids if r not in done]))
        return [done[r] for r in rids]

    def leave(self) -> None:
        """Nothing to do: requests go straight through."""


def generation_client(infer: InferProxy, backend: GenerationBackend | None = None) -> GenerationClient:
    """The :class:`~roll.rollout.client.GenerationClient` of ``actor_infer``: per-request when its strategy declares
    ``submit``, else batched (through ``backend``, default the role itself)."""
    if infer.spec is not None and infer.spec.can("submit"):
        return SubmitClient(infer)
    return BatchClient(backend or RoleBackend(infer))
