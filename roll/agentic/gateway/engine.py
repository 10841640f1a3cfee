"""The gateway's side of generation: HTTP request threads hand prompts to one loop thread that drives a
:class:`~roll.rollout.client.GenerationClient` (the rollout's generation client: batched on hf_infer, per request on
SGLang), so concurrent sessions share engine calls the way env managers' turns do.

Batching rule: the loop submits what is queued when every open session has a request waiting, or when the oldest
has waited ``max_wait_ms``, or at once while other requests are in flight (an engine that takes single requests
batches those itself); then it polls and hands each finished output to its waiting thread.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from roll.config.worker import GeneratingArgs
from roll.rollout.client import GenerationClient
from roll.strategies.base import GenerationOutput


@dataclass
class _Request:
    rid: str
    prompt: list[int]
    args: GeneratingArgs
    max_new_tokens: int
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


class GenerationLoop:
    """One thread between the gateway's request threads and a generation client (set per rollout by :meth:`use`)."""

    def __init__(self, max_wait_ms: float = 20.0):
        self.max_wait_s = max_wait_ms / 1000.0
        self.generator: GenerationClient | None = None
        self.expected = 0  # open sessions: when all have a request waiting, nothing is gained by waiting longer
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._flight: dict[str, _Request] = {}
        self.busy_s = 0.0  # seconds inside the client's submit/poll (engine time)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="roll-gateway-engine")
        self._thread.start()

    def use(self, generator: GenerationClient | None) -> None:
        """Send the following requests to ``generator`` (None: refuse them until a client is set)."""
        with self._cond:
            self.generator = generator
            self._cond.notify_all()

    def set_expected(self, sessions: int) -> None:
        with self._cond:
            self.expected = sessions
            self._cond.notify_all()

    def generate(
        self, rid: str, prompt: list[int], args: GeneratingArgs, max_new_tokens: int, timeout: float | None = None
    ) -> GenerationOutput:
        """Block until ``prompt`` is generated (``rid`` unique among requests in flight)."""
        request = _Request(rid, prompt, args, max_new_tokens)
        with self._cond:
            if self.generator is None:
                raise RuntimeError("no generation client is attached to the gateway (no rollout is running)")
            self._queue.append(request)
            self._cond.notify_all()
        return request.future.result(timeout)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def _take(self) -> list[_Request]:
        """Requests to submit now (called with the lock held; waits as the batching rule says)."""
        while not self._stop:
            if self._queue and (
                self._flight
                or len(self._queue) >= self.expected
                or time.monotonic() - self._queue[0].arrived >= self.max_wait_s
            ):
                taken, self._queue = self._queue, []
                return taken
            if self._flight:
                return []
            wait = None if not self._queue else max(1e-4, self.max_wait_s - (time.monotonic() - self._queue[0].arrived))
            self._cond.wait(wait)
        return []

    def _loop(self) -> None:
        while True:
            with self._cond:
                taken = self._take()
                if self._stop:
                    return
                generator = self.generator
            start = time.perf_counter()
            try:
                self._flight.update({r.rid: r for r in taken})
                for (_, budget), batch in _by_setting(taken).items():
                    generator.submit([(r.rid, r.prompt) for r in batch], batch[0].args, budget)
                done = generator.poll(list(self._flight)) if self._flight else {}
            except BaseException as exc:  # every waiting request sees the engine's error
                for r in list(self._flight.values()):
                    r.future.set_exception(exc)
                self._flight.clear()
                continue
            finally:
                self.busy_s += time.perf_counter() - start
            for rid, out in done.items():
                self._flight.pop(rid).future.set_result(out)


def _by_setting(requests: list[_Request]) -> dict[tuple[str, int], list[_Request]]:
    """Requests grouped by (sampling settings, token budget), in arrival order."""
    out: dict[tuple[str, int], list[_Request]] = {}
    for r in requests:
        out.setdefault((repr(r.args), r.max_new_tokens), []).append(r)
    return out
