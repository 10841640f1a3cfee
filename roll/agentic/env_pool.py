"""Concurrent env calls with a per-call timeout: :class:`EnvCallPool`.

Env ``reset``/``step`` calls of different envs run on a pool of daemon threads, so one slow env (a sandboxed tool,
a remote simulator) does not serialize the rest. Each call's clock starts when a thread picks it up; a call still
running ``timeout`` seconds later is *abandoned*: its thread is left to finish on its own (daemon threads never
block interpreter exit) and a replacement thread keeps the pool at full strength. The caller then replaces the
env, since a hung env's state is unknown. Pure-Python envs hold the GIL, so the win is for envs that wait
(I/O, subprocesses, C code that releases the GIL); for them the step time of a turn is the slowest env, not the sum.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class CallOutcome:
    """The result of one env call: ``value``, or the ``error`` it raised, or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


class EnvCallPool:
    """``num_threads`` daemon threads running env calls; :meth:`run_all` applies the timeout."""

    def __init__(self, num_threads: int):
        if num_threads < 1:
            raise ValueError(f"EnvCallPool: num_threads={num_threads} must be >= 1")
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._target = num_threads
        self._alive = 0
        self.abandoned = 0  # threads given up on so far (hung calls)
        self._spawn(num_threads)

    def _spawn(self, n: int) -> None:
        with self._lock:
            self._alive += n
        for _ in range(n):
            threading.Thread(target=self._work, daemon=True, name="roll-env").start()

    def _work(self) -> None:
        while True:
            fn, fut, started = self._tasks.get()
            if fut.set_running_or_notify_cancel():
                started[0] = time.monotonic()
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # handed to the caller, who decides (record or re-raise)
                    fut.set_exception(exc)
            with self._lock:
                if self._alive > self._target:  # a replacement was spawned while this thread hung: retire
                    self._alive -= 1
                    return

    def run_all(self, calls: list[Callable[[], Any]], timeout: float) -> list[CallOutcome]:
        """Run ``calls`` concurrently; each gets ``timeout`` seconds from its start (0 = no limit)."""
        jobs = []
        for fn in calls:
            fut: Future = Future()
            started = [None]
            self._tasks.put((fn, fut, started))
            jobs.append((fut, started))
        outcomes = [CallOutcome() for _ in jobs]
        pending = set(range(len(jobs)))
        while pending:
            now = time.monotonic()
            if timeout > 0:
                for i in list(pending):
                    fut, started = jobs[i]
                    if not fut.done() and started[0] is not None and now - started[0] >= timeout:
                        outcomes[i].timed_out = True
                        pending.discard(i)
                        self.abandoned += 1
                        self._spawn(1)
            for i in [i for i in pending if jobs[i][0].done()]:
                pending.discard(i)
                exc = jobs[i][0].exception()
                outcomes[i].error, outcomes[i].value = exc, None if exc else jobs[i][0].result()
            if pending:
                wait([jobs[i][0] for i in pending], timeout=self._next_wait(jobs, pending, timeout),
                     return_when=FIRST_COMPLETED)
        return outcomes

    @staticmethod
    def _next_wait(jobs: list, pending: set[int], timeout: float) -> float | None:
        """Seconds until the earliest running call's deadline (None: no limit)."""
        if timeout <= 0:
            return None
        now = time.monotonic()
        deadlines = [jobs[i][1][0] + timeout - now for i in pending if jobs[i][1][0] is not None]
        return max(0.0, min(deadlines)) + 1e-3 if deadlines else 0.01
