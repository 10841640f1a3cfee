"""A Sokoban env that fails on purpose, for the soak test: ``env_type: benchmarks.faulty_env:faulty_sokoban``.

Each ``step`` draws a number u in [0, 1) from a hash of (``fault_seed``, the episode's seed, the step's index in the
episode, the action text): u < ``error_rate`` raises :class:`InjectedFault`; u < ``error_rate + hang_rate`` sleeps
``hang_s`` seconds first (set it past the env manager's ``env_step_timeout``, which then abandons the call and
replaces the env); u < ``error_rate + hang_rate + never_rate`` never returns (a call blocked for good, as a tool
without a timeout); otherwise the step is Sokoban's. The same trajectory therefore meets the same faults in every
run, whatever the process, the restarts or the timing, so a run with faults is as reproducible as one without.
An episode whose solver plan was asked for (``solution()``: the warm start's demonstrations) has no faults: they
are for the RL rollouts.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from roll.envs import register_env
from roll.envs.sokoban.env import SokobanEnv


class InjectedFault(RuntimeError):
    """The failure :class:`FaultySokobanEnv` raises on purpose."""


@register_env("faulty_sokoban")
class FaultySokobanEnv(SokobanEnv):
    """Sokoban whose steps raise (``error_rate``) or hang (``hang_rate``, ``hang_s`` seconds) reproducibly.

    Arguments: those of :class:`~roll.envs.sokoban.env.SokobanEnv`, plus ``error_rate`` (0.10), ``hang_rate``
    (0.02), ``hang_s`` (5.0), ``never_rate`` (0.0) and ``fault_seed`` (0).
    """

    def __init__(
        self,
        *,
        error_rate: float = 0.10,
        hang_rate: float = 0.02,
        hang_s: float = 5.0,
        never_rate: float = 0.0,
        fault_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        rates = (error_rate, hang_rate, never_rate)
        if min(rates) < 0 or sum(rates) > 1:
            raise ValueError(
                f"error_rate={error_rate}, hang_rate={hang_rate}, never_rate={never_rate}: need rates "
                f">= 0 summing to <= 1"
            )
        super().__init__(**kwargs)
        self.error_rate, self.hang_rate, self.hang_s, self.fault_seed = error_rate, hang_rate, hang_s, fault_seed
        self.never_rate = never_rate
        self._episode_seed: int | None = None
        self._demonstration = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._episode_seed, self._demonstration = seed, False
        return super().reset(seed=seed, options=options)

    def solution(self) -> list[str] | None:
        self._demonstration = True
        return super().solution()

    def fault_draw(self, action: str) -> float:
        """u in [0, 1) for the next step with ``action`` (a pure function of the episode and the action)."""
        key = f"{self.fault_seed}|{self._episode_seed}|{self.num_steps}|{action}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64

    def step(self, action: str):
        if self._demonstration:
            return super().step(action)
        u = self.fault_draw(action)
        if u < self.error_rate:
            raise InjectedFault(f"injected fault at step {self.num_steps} (u={u:.3f})")
        if u < self.error_rate + self.hang_rate:
            time.sleep(self.hang_s)
        elif u < self.error_rate + self.hang_rate + self.never_rate:
            threading.Event().wait()  # never set: this call never returns
        return super().step(action)
