"""Test parts for the agentic tests: a registered flaky env and a scripted generator.

``flaky_test`` fails (raises) on every ``fail_every``-th env call and hangs on every ``hang_every``-th, counted over
all instances (a class-level counter), and logs each injected fault so tests can compare counts exactly.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from roll.config.worker import GeneratingArgs
from roll.envs.base import TextEnv, Transition
from roll.envs.registry import list_envs, register_env
from roll.rollout.client import BatchClient
from roll.strategies.base import GenerationOutput


class FlakyEnv(TextEnv):
    """Observation ``"pos {k}"``; any ``<answer>go</answer>`` moves on; ends after ``max_steps`` actions.

    The start state depends on the seed (``pos {seed % 1000}``) so tests can see group seeding.
    """

    valid_actions = ("go",)
    counter = itertools.count()
    lock = threading.Lock()
    faults: list[str] = []
    active = 0
    max_active = 0

    def __init__(
        self,
        fail_every: int = 0,
        hang_every: int = 0,
        hang_s: float = 3.0,
        step_sleep: float = 0.0,
        max_steps: int = 3,
        reward: float = 1.0,
        hang_init: bool = False,
        **kwargs: Any,
    ):
        super().__init__(max_steps=max_steps, **kwargs)
        self.reward = reward
        if hang_init:  # a constructor that never returns (it waits for a server that never answers)
            threading.Event().wait()
        self.fail_every, self.hang_every, self.hang_s, self.step_sleep = fail_every, hang_every, hang_s, step_sleep
        self.pos = 0

    @classmethod
    def reset_log(cls) -> None:
        with cls.lock:
            cls.counter, cls.faults, cls.active, cls.max_active = itertools.count(), [], 0, 0

    def _fault(self, where: str) -> None:
        with FlakyEnv.lock:
            k = next(FlakyEnv.counter)
            kind = (
                "error"
                if self.fail_every and k % self.fail_every == self.fail_every - 1
                else "timeout"
                if self.hang_every and k % self.hang_every == self.hang_every // 2
                else None
            )
            if kind:
                FlakyEnv.faults.append(kind)
        if kind == "error":
            raise RuntimeError(f"injected env failure in {where}")
        if kind == "timeout":
            time.sleep(self.hang_s)

    def instruction(self) -> str:
        return "Answer go."

    def _reset(self, rng, options) -> str:
        self._fault("reset")
        self.pos = int(self.np_random_seed or 0) % 1000
        return f"pos {self.pos}"

    def _apply(self, action: str) -> Transition:
        self.pos += 1
        return Transition(f"pos {self.pos}", self.reward, False)

    def _observation(self) -> str:
        return f"pos {self.pos}"

    def step(self, action: str):
        with FlakyEnv.lock:
            FlakyEnv.active += 1
            FlakyEnv.max_active = max(FlakyEnv.max_active, FlakyEnv.active)
        try:
            if self.step_sleep:
                time.sleep(self.step_sleep)
            self._fault("step")
            return super().step(action)
        finally:
            with FlakyEnv.lock:
                FlakyEnv.active -= 1


if "flaky_test" not in list_envs():
    register_env("flaky_test", FlakyEnv)


class ScriptedGenerator(BatchClient):
    """Replies with fixed text (canonically tokenized) + end-of-turn; counts calls and prompts per call. A batched
    client over itself: every poll generates all pending requests in one :meth:`generate` call."""

    def __init__(self, tokenizer: Any, text: str = "<answer>go</answer>", cut_every: int = 0):
        super().__init__(self)
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        self.eos = tokenizer.eos_token_id
        self.cut_every = cut_every  # every n-th reply is cut by length (no end-of-turn token)
        self.calls: list[int] = []

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        self.calls.append(len(prompts))
        out = []
        for i, _ in enumerate(prompts):
            if self.cut_every and (len(self.calls) + i) % self.cut_every == 0:
                out.append(GenerationOutput(self.ids[:2], [-1.0, -1.0], "length"))
            else:
                out.append(GenerationOutput(self.ids + [self.eos], [-0.5] * (len(self.ids) + 1), "stop"))
        return out

    def leave(self) -> None:
        """No batching here."""

    def __getstate__(self) -> dict[str, Any]:  # sent to a Ray env manager: the script too, not only the client
        return {**super().__getstate__(), "ids": self.ids, "eos": self.eos, "cut_every": self.cut_every, "calls": []}
