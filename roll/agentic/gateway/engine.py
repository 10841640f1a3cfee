"""The gateway's side of generation: HTTP request threads hand prompts to one loop thread that drives a
:class:`~roll.rollout.client.GenerationClient` (the rollout's generation client: batched on hf_infer, per request on
SGLang), so concurrent sessions share engine calls the way env managers' turns do.

Batching rule (lock-step, as roll's env manager steps its envs): while nothing is in flight, the loop submits when
every open session has a request waiting, in the sessions' start order; a session that has not sent its next
request ``wait_s`` after the oldest waiting one is a *straggler*: the batch goes without it, and the next batches do
not wait for it until it sends a request. So while every harness sends its next request within ``wait_s``, each
batch holds the same requests in the same order from run to run, and a run is as reproducible as the native env
manager's. While requests are in flight (an engine that takes single requests, ``submit`` ability) new requests are
submitted at once: such an engine batches them itself, and its runs are not reproducible either way.
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
    session: str
    prompt: list[int]
    args: GeneratingArgs
    max_new_tokens: int
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


class GenerationLoop:
    """One thread between the gateway's request threads and a generation client (set per rollout by :meth:`use`).

    Args:
        wait_s: how long a batch waits for open sessions that have not sent their next request (0: not at all).
    """

    def __init__(self, wait_s: float = 10.0):
        self.wait_s = wait_s
        self.generator: GenerationClient | None = None
        self._open: dict[str, int] = {}  # open sessions and their start order
        self._stragglers: set[str] = set()  # open sessions no batch waits for until they send a request
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._flight: dict[str, _Request] = {}
        self.busy_s = 0.0  # seconds inside the client's submit/poll (engine time)
        self.straggled = 0  # times a batch went without a session that was still open (a run may then differ)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="roll-gateway-engine")
        self._thread.start()

    def use(self, generator: GenerationClient | None) -> None:
        """Send the following requests to ``generator`` (None: refuse them until a client is set)."""
        with self._cond:
            self.generator = generator
            self._cond.notify_all()

    def open(self, session: str, order: int) -> None:
        """A session whose requests the batches wait for; ``order`` places its requests within a batch."""
        with self._cond:
            self._open[session] = order
            self._cond.notify_all()

    def close(self, session: str) -> None:
        """The session has ended: no batch waits for it any more."""
        with self._cond:
            self._open.pop(session, None)
            self._stragglers.discard(session)
            self._cond.notify_all()

    def generate(
        self,
        rid: str,
        session: str,
        prompt: list[int],
        args: GeneratingArgs,
        max_new_tokens: int,
        timeout: float | None = None,
    ) -> GenerationOutput:
        """Block until ``prompt`` of ``session`` is generated (``rid`` unique among requests in flight)."""
        request = _Request(rid, session, prompt, args, max_new_tokens)
        with self._cond:
            if self.generator is None:
                raise RuntimeError("no generation client is attached to the gateway (no rollout is running)")
            self._stragglers.discard(session)
            self._queue.append(request)
            self._cond.notify_all()
        return request.future.result(timeout)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def _missing(self) -> set[str]:
        """Open sessions, stragglers aside, without a request waiting (called with the lock held)."""
        waiting = {r.session for r in self._queue}
        return {s for s in self._open if s not in waiting and s not in self._stragglers}

    def _take(self) -> list[_Request]:
        """Requests to submit now, in session start order (called with the lock held; waits as the batching rule
        says)."""
        while not self._stop:
            if self._queue:
                missing = self._missing()
                late = time.monotonic() - self._queue[0].arrived >= self.wait_s
                if self._flight or not missing or late:
                    if missing and not self._flight:
                        self._stragglers |= missing
                        self.straggled += 1
                    taken, self._queue = self._queue, []
                    return sorted(taken, key=lambda r: self._open.get(r.session, len(self._open)))
            if self._flight:
                return []
            wait = None if not self._queue else max(1e-4, self.wait_s - (time.monotonic() - self._queue[0].arrived))
            self._cond.wait(wait)
        return []

    def _loop(self) -> None:
        while True:
            with self._cond:
                taken = self._take()
                if self._stop:
                    return
                generator = self.generator
            if generator is None:  # a harness still calling after its rollout ended (its session is closed too)
                for r in taken:
                    r.future.set_exception(RuntimeError("the rollout has ended: no generation client is attached"))
                continue
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
    """Requests grouped by (sampling settings, token budget), in the order given."""
    out: dict[tuple[str, int], list[_Request]] = {}
    for r in requests:
        out.setdefault((repr(r.args), r.max_new_tokens), []).append(r)
    return out
