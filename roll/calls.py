"""Concurrent calls into user code with an enforced deadline: :class:`CallPool`. The env managers run env
reset/step and env construction on one, the reward workers their reward functions.

Calls of different envs run on a pool of daemon threads, so one slow env (a sandboxed tool, a remote simulator)
does not serialize the rest. Each call's clock starts when a thread picks it up; a call still running ``timeout``
seconds later is *abandoned*: the caller gets ``timed_out`` at once, the call's thread is left to finish on its own
(daemon threads never block interpreter exit) and retires when it does, and a fresh thread takes its place, so the
pool always has ``num_threads`` threads that are not stuck in an abandoned call, however many calls never return.
The caller then replaces the env, since a hung env's state is unknown.

Limits: a thread cannot be killed, so a call that never returns keeps its thread (and its env) for good; after
``max_hung`` such threads the pool raises :class:`TooManyHungCalls` rather than grow without bound. A call that
never releases the GIL (a C loop) stops every thread of the process: run such code in a subprocess with its own
time limit, as the ``python`` tool does. Pure-Python envs hold the GIL, so the concurrency win is for envs that
wait (I/O, subprocesses, C code that releases the GIL); for them the step time of a turn is the slowest env.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any


@dataclass
class CallOutcome:
    """The result of one env call: ``value``, or the ``error`` it raised, or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


class TooManyHungCalls(RuntimeError):
    """More than ``max_hung`` abandoned calls are still running: the user code never returns, so the run stops."""


@dataclass
class _Task:
    fn: Callable[[], Any]
    future: Future
    started: float | None = None  # monotonic time a thread picked it up
    abandoned: bool = False  # timed out: its thread retires when (if ever) the call returns


class CallPool:
    """``num_threads`` daemon threads running calls; :meth:`run_all` applies the deadline."""

    def __init__(self, num_threads: int, max_hung: int = 256):
        if num_threads < 1:
            raise ValueError(f"CallPool: num_threads={num_threads} must be >= 1")
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.max_hung = max_hung
        self.abandoned = 0  # calls given up on so far
        self.hung = 0  # abandoned calls still running (their threads are not in the pool any more)
        self._threads: list[threading.Thread] = []
        for _ in range(num_threads):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._work, daemon=True, name="roll-call")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    @property
    def live_threads(self) -> int:
        """Threads of this pool still alive: ``num_threads`` plus those stuck in abandoned calls."""
        with self._lock:
            return sum(t.is_alive() for t in self._threads)

    def _work(self) -> None:
        while True:
            task: _Task = self._tasks.get()
            if not task.future.set_running_or_notify_cancel():
                continue
            task.started = time.monotonic()
            try:
                task.future.set_result(task.fn())
            except BaseException as exc:  # handed to the caller, who decides (record or re-raise)
                task.future.set_exception(exc)
            with self._lock:
                if task.abandoned:  # a replacement thread took this one's place when the call timed out
                    self.hung -= 1
                    return

    def _abandon(self, task: _Task) -> bool:
        """Give up on a running ``task`` (True), unless it finished meanwhile (False)."""
        with self._lock:
            if task.future.done():
                return False
            task.abandoned = True
            self.abandoned += 1
            self.hung += 1
            hung = self.hung
        if hung > self.max_hung:
            raise TooManyHungCalls(f"{hung} calls never returned (more than max_hung={self.max_hung})")
        self._spawn()
        return True

    def run_all(self, calls: list[Callable[[], Any]], timeout: float) -> list[CallOutcome]:
        """Run ``calls`` concurrently; each gets ``timeout`` seconds from its start (0 = no limit). Returns when
        every call has returned, raised or timed out.

        Raises:
            TooManyHungCalls: more than ``max_hung`` abandoned calls are still running."""
        tasks = [_Task(fn, Future()) for fn in calls]
        for task in tasks:
            self._tasks.put(task)
        outcomes = [CallOutcome() for _ in tasks]
        pending = set(range(len(tasks)))
        while pending:
            now = time.monotonic()
            for i in sorted(pending):
                task = tasks[i]
                if task.future.done():
                    pending.discard(i)
                    exc = task.future.exception()
                    outcomes[i].error, outcomes[i].value = exc, None if exc else task.future.result()
                elif timeout > 0 and task.started is not None and now - task.started >= timeout and self._abandon(task):
                    pending.discard(i)
                    outcomes[i].timed_out = True
            if pending:
                wait(
                    [tasks[i].future for i in pending],
                    timeout=self._next_wait(tasks, pending, timeout),
                    return_when=FIRST_COMPLETED,
                )
        return outcomes

    @staticmethod
    def _next_wait(tasks: list[_Task], pending: set[int], timeout: float) -> float | None:
        """Seconds until the earliest running call's deadline (None: no limit; a short poll while a call waits
        for a thread, since its clock starts only then)."""
        if timeout <= 0:
            return None
        now = time.monotonic()
        deadlines = [tasks[i].started + timeout - now for i in pending if tasks[i].started is not None]
        waiting = any(tasks[i].started is None for i in pending)
        soonest = max(0.0, min(deadlines)) + 1e-3 if deadlines else 0.05
        return min(soonest, 0.05) if waiting else soonest
