"""The dynamic batcher: generate requests of several clients (env managers) merged into few calls of one backend.

Batching rule: pending requests with the same sampling settings and token budget are merged and sent as one call
when (a) every expected client has a request waiting, or (b) they hold ``max_batch_size`` prompts, or (c) the
oldest has waited ``max_wait_ms``. A request is never split; one larger than ``max_batch_size`` goes alone (the
backend chunks it by its own ``generate_batch_size``). Clients announce themselves with :meth:`DynamicBatcher.open`
and leave with :meth:`DynamicBatcher.leave` so the batcher never waits for a client that has finished its rollout.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from roll.config.worker import GeneratingArgs
from roll.rollout.client import GenerationBackend
from roll.strategies.base import GenerationOutput


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


class DynamicBatcher:
    """Merges concurrent ``generate`` requests of several clients into few calls of ``inner``."""

    def __init__(self, inner: GenerationBackend, max_batch_size: int = 256, max_wait_ms: float = 20.0):
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


class RemoteBatcher:
    """A client of a :class:`DynamicBatcher` running as a Ray actor (picklable; used inside env managers)."""

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
