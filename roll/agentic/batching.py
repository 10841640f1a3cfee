"""Generation clients. One protocol for every caller (:class:`Generator`): ``submit`` requests, ``poll`` for the
finished ones, ``abort`` the rest, ``leave`` when done; ``generate`` is the batch form (submit all, poll until
done). Env managers use submit/poll; the RLVR pipeline uses ``generate``.

Two clients implement it over the inference role: :class:`~roll.agentic.rollout.SubmitGenerator` sends each request
to an engine that takes requests one at a time (strategy ability ``submit``: SGLang's continuous batching batches
what is in flight); :class:`BatchedClient` keeps submitted requests until ``poll`` and then generates all of them
in one batch call per sampling setting, through a batch generator: :class:`GroupGenerator` (the role's workers,
one chunk per rank) or :class:`BatchingGenerator` (dynamic batching of requests from several env managers into one
generate call).

Batching rule: pending requests with the same sampling settings and token budget are merged and sent as one call
when (a) every expected client has a request waiting, or (b) they hold ``max_batch_size`` prompts, or (c) the
oldest has waited ``max_wait_ms``. A request is never split; one larger than ``max_batch_size`` goes alone (the
backend chunks it by its own ``generate_batch_size``). Clients announce themselves with :meth:`open` and leave with
:meth:`leave` so the batcher never waits for a client that has finished its rollout.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll.config.worker import GeneratingArgs
from roll.distributed.roles import InferProxy
from roll.strategies.base import GenerationOutput


class BatchGenerator(Protocol):
    """Anything that turns a batch of prompts (token ids) into generations, in prompt order."""

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]: ...

    def leave(self) -> None:
        """The calling client has finished its rollout (a batcher stops waiting for it)."""


class Generator(BatchGenerator, Protocol):
    """The generation protocol of every caller: requests ``(rid, prompt ids)`` in, finished outputs by rid out."""

    def submit(
        self, requests: list[tuple[str, list[int]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> None:
        """Queue requests; ``rid`` must be unique among the requests in flight."""

    def poll(self, rids: list[str]) -> dict[str, GenerationOutput]:
        """Finished requests among ``rids`` (at least one unless none can finish), in the order of ``rids``."""

    def abort(self, rids: list[str]) -> None:
        """Drop requests still in flight."""


class GroupGenerator:
    """Sends a list of prompts to the inference role as one chunk per rank (data parallel)."""

    def __init__(self, infer: InferProxy):
        self.infer = infer

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        return self.infer.generate(prompts, args, max_new_tokens)

    def leave(self) -> None:
        """Nothing to do: requests go straight through."""


class BatchedClient:
    """:class:`Generator` over a batch generator: ``submit`` queues; ``poll`` generates every queued request, one
    ``inner.generate`` call per (sampling settings, token budget) in the order they were first submitted, with the
    prompts in submission order."""

    def __init__(self, inner: BatchGenerator):
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


@dataclass
class _Request:
    prompts: list[list[int]]
    args: GeneratingArgs
    max_new_tokens: int | None
    arrived: float
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple[str, int | None]:
        return repr(self.args), self.max_new_tokens


class BatchingGenerator:
    """Merges concurrent ``generate`` requests of several clients into few calls of ``inner``."""

    def __init__(self, inner: BatchGenerator, max_batch_size: int = 256, max_wait_ms: float = 20.0):
        self.inner, self.max_batch_size, self.max_wait_s = inner, max_batch_size, max_wait_ms / 1000.0
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._clients = 0
        self.stats = {"calls": 0, "prompts": 0, "busy_s": 0.0}
        threading.Thread(target=self._loop, daemon=True, name="roll-batcher").start()

    def open(self, clients: int) -> None:
        """``clients`` more clients will send requests until each calls :meth:`leave`."""
        with self._cond:
            self._clients += clients
            self._cond.notify_all()

    def leave(self) -> None:
        with self._cond:
            self._clients = max(0, self._clients - 1)
            self._cond.notify_all()

    def get_stats(self) -> dict[str, float]:
        """Inner calls, prompts sent and seconds the inner generator was busy, since the last call."""
        with self._cond:
            out, self.stats = dict(self.stats), {"calls": 0, "prompts": 0, "busy_s": 0.0}
        return out

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        request = _Request(prompts, args, max_new_tokens, time.monotonic())
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
        return request.future.result()

    def _ready(self) -> bool:
        """Whether the pending requests should be sent now (called with the lock held)."""
        if not self._pending:
            return False
        size = sum(len(r.prompts) for r in self._pending)
        waited = time.monotonic() - self._pending[0].arrived
        return len(self._pending) >= self._clients or size >= self.max_batch_size or waited >= self.max_wait_s

    def _take(self) -> list[_Request]:
        """The oldest request plus every pending one with its key that fits in ``max_batch_size``."""
        first = self._pending[0]
        batch, size = [first], len(first.prompts)
        for r in self._pending[1:]:
            if r.key == first.key and size + len(r.prompts) <= self.max_batch_size:
                batch.append(r)
                size += len(r.prompts)
        self._pending = [r for r in self._pending if all(r is not b for b in batch)]
        return batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._ready():
                    timeout = None
                    if self._pending:
                        timeout = max(1e-4, self.max_wait_s - (time.monotonic() - self._pending[0].arrived))
                    self._cond.wait(timeout)
                batch = self._take()
            self._send(batch)

    def _send(self, batch: list[_Request]) -> None:
        prompts = [p for r in batch for p in r.prompts]
        start = time.perf_counter()
        try:
            outputs = self.inner.generate(prompts, batch[0].args, batch[0].max_new_tokens)
        except BaseException as exc:  # every waiting client sees the engine's error
            for r in batch:
                r.future.set_exception(exc)
            return
        with self._cond:
            self.stats["calls"] += 1
            self.stats["prompts"] += len(prompts)
            self.stats["busy_s"] += time.perf_counter() - start
        offset = 0
        for r in batch:
            r.future.set_result(outputs[offset : offset + len(r.prompts)])
            offset += len(r.prompts)


class RemoteGenerator:
    """A client of a :class:`BatchingGenerator` running as a Ray actor (picklable; used inside env managers)."""

    def __init__(self, handle: Any):
        self.handle = handle

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        import ray

        return ray.get(self.handle.generate.remote(prompts, args, max_new_tokens))

    def leave(self) -> None:
        import ray

        ray.get(self.handle.leave.remote())
