"""Asynchronous rollouts (``async_generation_ratio`` = k >= 1), one mechanism for both pipelines: producers keep
generating groups across training steps into a :class:`GroupBuffer`; the trainer takes complete groups, oldest
first, while the producers go on; the weight sync lands between generate calls (see
:meth:`roll.distributed.worker.Worker.set_policy_version`).

Policy versions: the driver counts weight syncs (``Pipeline.policy_version``) and tells the engine after each;
every generation output carries the version the engine had when it started it, so a group's version is the oldest
among its tokens, and its staleness when trained is ``trainer version - group version`` (the trainer's version is
the syncs so far: the weights it trains are the ones last pushed).

Admission (AReaL's rule, counted in groups): a producer starts ``n`` new groups only while
``running + waiting + n <= (k + 1 - unsynced) * batch_groups``, where ``unsynced`` is 1 between the trainer taking
a batch and the sync of the weights it trains on (else 0). A group admitted at version v has fewer than
``(k + 1 - unsynced) * batch_groups`` groups ahead of it, so taken in order it is trained at the latest k + 1 -
unsynced takes later, at version <= v + k: staleness <= k by construction, and long episodes are never evicted
for being slow. A group that still exceeds k (finished far out of order) is dropped when taken, and counted.

The buffer knows nothing of what a group holds; :class:`Producers` runs the loops (one thread per producer).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Group:
    """A finished group: its samples (trajectories, or an RLVR prompt group), the oldest policy version among its
    tokens, and its mean episode length in generated tokens (for the dropped-vs-trained metric)."""

    items: Any
    version: int
    length: float
    seq: int = 0  # admission order, set by the buffer


class GroupBuffer:
    """Admission, the waiting groups, and the staleness of what the trainer takes (thread-safe)."""

    def __init__(self, k: int, batch_groups: int, version: int = 0):
        if k < 1 or batch_groups < 1:
            raise ValueError(f"GroupBuffer: k={k} and batch_groups={batch_groups} must be >= 1")
        self.k, self.batch_groups, self.version = k, batch_groups, version
        self.running, self.waiting = 0, []  # groups admitted and being generated; finished groups, by seq
        self.unsynced = False  # a batch was taken and its weights are not pushed yet
        self.peak = 0  # the most groups running + waiting since the last take (<= (k + 1) * batch_groups)
        self._seq, self._dropped, self._closed, self._paused = 0, [], False, False
        self._blocked_s = 0.0  # producers' seconds waiting for admission (counted when they are admitted)
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    @property
    def limit(self) -> int:
        """Groups allowed running + waiting now."""
        return (self.k + 1 - int(self.unsynced)) * self.batch_groups

    def admit(self, n: int) -> int | None:
        """Block until ``n`` new groups may start; returns the version they start under (None once closed)."""
        with self._cond:
            start = time.monotonic()
            self._cond.wait_for(
                lambda: self._closed or (not self._paused and self.running + len(self.waiting) + n <= self.limit)
            )
            self._blocked_s += time.monotonic() - start
            if self._closed:
                return None
            self.running += n
            self.peak = max(self.peak, self.running + len(self.waiting))
            return self.version

    def put(self, admitted: int, groups: list[Group]) -> None:
        """``admitted`` groups finished; ``groups`` are the usable ones (failed groups are left out)."""
        with self._cond:
            self.running -= admitted
            for g in groups:
                g.seq, self._seq = self._seq, self._seq + 1
                self.waiting.append(g)
            self.peak = max(self.peak, self.running + len(self.waiting))
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """A producer crashed: the trainer's next :meth:`take` raises ``error``."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def take(self, n: int) -> tuple[list[Group], dict[str, float]]:
        """The ``n`` oldest finished groups (waits for them; groups staler than k are dropped and counted) and
        the metrics ``rollout/staleness_mean|max``, ``rollout/dropped_groups``, the mean episode length of the
        trained and of the dropped groups, ``rollout/policy_version``, ``rollout/buffered_groups_peak`` (the
        most groups running + waiting since the last take) and ``time/rollout_admission_wait`` (the producers'
        seconds blocked by the bound since the last take, summed: idle engine time when producers are the only
        clients)."""
        with self._cond:
            while True:
                self._cond.wait_for(lambda: self._error is not None or len(self.waiting) >= n)
                if self._error is not None:
                    raise RuntimeError(f"an asynchronous rollout producer failed: {self._error}") from self._error
                self.waiting.sort(key=lambda g: (g.version, g.seq))
                stale = [g for g in self.waiting if self.version - g.version > self.k]
                self.waiting = [g for g in self.waiting if self.version - g.version <= self.k]
                self._dropped += stale
                if len(self.waiting) >= n:
                    break
            taken, self.waiting = self.waiting[:n], self.waiting[n:]
            self.unsynced = True
            dropped, self._dropped = self._dropped, []
            peak, self.peak = self.peak, self.running + len(self.waiting)
            blocked, self._blocked_s = self._blocked_s, 0.0
            self._cond.notify_all()
        ages = [self.version - g.version for g in taken]
        metrics = {
            "rollout/staleness_mean": sum(ages) / len(ages),
            "rollout/staleness_max": float(max(ages)),
            "rollout/dropped_groups": float(len(dropped)),
            "rollout/trained_episode_length": sum(g.length for g in taken) / len(taken),
            "rollout/policy_version": float(self.version),
            "rollout/buffered_groups_peak": float(peak),
            "time/rollout_admission_wait": blocked,
        }
        if dropped:
            metrics["rollout/dropped_episode_length"] = sum(g.length for g in dropped) / len(dropped)
        return taken, metrics

    def set_version(self, version: int) -> None:
        """The weights of ``version`` are pushed to the engine: the trainer's batch is synced."""
        with self._cond:
            self.version, self.unsynced = version, False
            self._cond.notify_all()

    def drain(self) -> list[Group]:
        """Stop admitting and wait for the running groups (a checkpoint); returns the waiting groups. Call
        :meth:`release` after."""
        with self._cond:
            self._paused = True
            self._cond.wait_for(lambda: self.running == 0 or self._error is not None)
            return list(self.waiting)

    def release(self) -> None:
        """Admit again after :meth:`drain`."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def close(self) -> None:
        """Admit nothing more (producers stop after their current unit)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Producers:
    """One thread per producer, each looping: admit ``unit`` groups, ``produce(producer, round, version)`` them
    (rounds count from ``first_rounds[producer]`` + 1), put the usable groups in the buffer. A producer's error
    reaches the trainer at its next take."""

    def __init__(
        self,
        buffer: GroupBuffer,
        produce: Callable[[int, int, int], list[Group]],
        units: list[int],
        first_rounds: list[int] | None = None,
    ):
        self.buffer, self.produce, self.units = buffer, produce, units
        self.rounds = list(first_rounds or [0] * len(units))  # rounds finished per producer (checkpointed)
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"roll-producer-{i}")
            for i in range(len(units))
        ]
        for t in self._threads:
            t.start()

    def _loop(self, i: int) -> None:
        while True:
            version = self.buffer.admit(self.units[i])
            if version is None:
                return
            try:
                groups = self.produce(i, self.rounds[i] + 1, version)
            except BaseException as exc:  # the trainer raises it; this producer stops
                self.buffer.fail(exc)
                return
            self.rounds[i] += 1
            self.buffer.put(self.units[i], groups)

    def state_dict(self, encode: Callable[[Any], Any]) -> dict[str, Any]:
        """For a checkpoint: admission stops, the running groups finish, then the rounds done and the waiting
        groups (``encode``: a group's items to plain data). Call ``buffer.release()`` once the checkpoint is
        written. A resumed run trains the saved groups first and continues each producer's rounds (the groups
        generated after the checkpoint are generated again, with the same seeds)."""
        waiting = self.buffer.drain()
        return {
            "rounds": list(self.rounds),
            "groups": [{"items": encode(g.items), "version": g.version, "length": g.length} for g in waiting],
        }

    @classmethod
    def start(
        cls,
        k: int,
        batch_groups: int,
        version: int,
        produce: Callable[[int, int, int], list[Group]],
        units: list[int],
        state: dict[str, Any] | None = None,
        decode: Callable[[Any], Any] = lambda x: x,
    ) -> Producers:
        """A buffer at ``version`` (with the groups of ``state``, from :meth:`state_dict`) and its producers."""
        for unit in units:
            if unit > (k + 1) * batch_groups:
                raise ValueError(
                    f"async_generation_ratio={k}: a producer starts {unit} groups at a time, more than "
                    f"(k + 1) x the batch's {batch_groups} groups, so it could never be admitted: use "
                    f"more env managers (num_env_managers) or a larger k"
                )
        buffer = GroupBuffer(k, batch_groups, version)
        if state:
            buffer.put(0, [Group(decode(g["items"]), int(g["version"]), float(g["length"])) for g in state["groups"]])
        return cls(buffer, produce, units, state["rounds"] if state else None)

    def close(self) -> None:
        """Stop admitting and wait for the producers to finish their current unit."""
        self.buffer.close()
        for t in self._threads:
            t.join()
