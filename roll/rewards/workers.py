"""Reward workers: score batches of responses with registered rule rewards, in-process or as Ray actors."""

from __future__ import annotations

import functools
import inspect
import math
import traceback
from collections.abc import Mapping
from typing import Any

from roll.calls import CallPool
from roll.rewards import math_answer  # noqa: F401  (registers the built-in "math" reward)
from roll.rewards.registry import REWARDS, RewardFn, RewardResult, get_reward_fn, register_reward, registered_rewards

__all__ = ["NonFiniteReward", "RewardTimeout", "RewardWorker", "RewardWorkerPool", "register_reward"]


class NonFiniteReward(ValueError):
    """A reward function returned a score that is NaN or infinite (the message names the function and sample)."""


class RewardTimeout(TimeoutError):
    """A reward function did not return within ``timeout_s`` (the message names the function and sample)."""


def user_registered_rewards() -> dict[str, RewardFn]:
    """Rewards registered in this process by modules outside ``roll`` (a Ray actor imports only roll's own)."""
    fns = {name: get_reward_fn(name) for name in registered_rewards()}
    return {name: fn for name, fn in fns.items() if not getattr(fn, "__module__", "").startswith("roll.")}


def _defined_at(fn: Any) -> tuple[Any, str]:
    """The function's code object (or None) and ``file:line`` where it is defined."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code, f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)


def _named(name: str, fn: Any) -> str:
    """``reward function 'name' (qualname defined at file:line)``."""
    return f"reward function {name!r} ({getattr(fn, '__qualname__', fn)!s} defined at {_defined_at(fn)[1]})"


def reward_failure_note(name: str, fn: Any, exc: BaseException, index: int, tag: str, response: str) -> str:
    """A one-line note for an exception raised by reward ``name``: where the function is defined and the line
    (in its own file when the traceback passes through it, else the deepest frame) that raised."""
    code, defined = _defined_at(fn)
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if code is not None and f.filename == code.co_filename]
    raised = (own or frames)[-1] if frames else None
    where = f" raised at {raised.filename}:{raised.lineno}" if raised else ""
    return (
        f"reward function {name!r} ({getattr(fn, '__qualname__', fn)!s} defined at {defined}){where} while "
        f"scoring sample {index} (tag {tag!r}, response {response[:80]!r})"
    )


class RewardWorker:
    """Scores responses with the reward function registered for each sample's tag.

    Args:
        reward_options: keyword options per reward name, e.g. ``{"math": {"format_reward": 0.1}}``.
        tag_to_reward: maps a data tag to a reward name (``{"gsm8k": "math"}``); a tag not listed is used as
            the reward name itself.
        user_rewards: reward functions registered in the driver process outside ``roll`` (see
            :func:`user_registered_rewards`); registered here too, so a Ray actor knows the user's rewards.
        timeout_s: seconds one call may take (0 = no limit); a call still running then is abandoned (on a
            :class:`~roll.calls.CallPool` thread) and :class:`RewardTimeout` raised.
    """

    def __init__(
        self,
        reward_options: Mapping[str, Mapping[str, Any]] | None = None,
        tag_to_reward: Mapping[str, str] | None = None,
        user_rewards: Mapping[str, RewardFn] | None = None,
        timeout_s: float = 0.0,
    ) -> None:
        self.timeout_s = timeout_s
        self._pool = CallPool(1) if timeout_s > 0 else None  # one call at a time: rewards need not be thread-safe
        for name, fn in (user_rewards or {}).items():
            if name not in registered_rewards():
                register_reward(name)(fn)
        # names as registered (a "package.module:name" is imported here and keyed by its name)
        self.reward_options = {REWARDS.resolve(name): dict(opts) for name, opts in (reward_options or {}).items()}
        self.tag_to_reward = {tag: REWARDS.resolve(name) for tag, name in (tag_to_reward or {}).items()}

    def compute(self, responses: list[str], ground_truths: list[str], tags: list[str]) -> list[RewardResult]:
        """Score ``responses[i]`` against ``ground_truths[i]`` with the reward for ``tags[i]``; order is kept.

        Raises:
            ValueError: if the three lists differ in length.
            KeyError: if a tag maps to no registered reward (the message lists the registered ones).
            NonFiniteReward: a reward returned a score that is not a finite number (NaN, inf, None).
        """
        if not len(responses) == len(ground_truths) == len(tags):
            raise ValueError(
                f"responses, ground_truths and tags must have one entry per sample; got lengths "
                f"{len(responses)}, {len(ground_truths)}, {len(tags)}"
            )
        results = []
        for i, (response, truth, tag) in enumerate(zip(responses, ground_truths, tags)):
            name = self.tag_to_reward.get(tag, tag)
            fn = get_reward_fn(name)
            options = self.reward_options.get(name, {})
            try:
                result = self._call(functools.partial(fn, response, truth, **options))
            except TimeoutError:
                raise RewardTimeout(
                    f"{_named(name, fn)} did not return within rewards.timeout_s={self.timeout_s}s "
                    f"for sample {i} (tag {tag!r}, response {response[:80]!r})"
                ) from None
            except Exception as exc:  # keep the user's exception and traceback; say which reward and sample
                exc.add_note(reward_failure_note(name, fn, exc, i, tag, response))
                raise
            score = getattr(result, "score", None)
            if not isinstance(score, (int, float)) or not math.isfinite(score):
                raise NonFiniteReward(
                    f"{_named(name, fn)} returned score={score!r} for sample {i} (tag {tag!r}, response "
                    f"{response[:80]!r}); a reward must return RewardResult with a finite float score"
                )
            results.append(result)
        return results

    def _call(self, call: Any) -> Any:
        """``call()`` under the deadline (TimeoutError when it passes; its own exception when it raises)."""
        if self._pool is None:
            return call()
        outcome = self._pool.run_all([call], self.timeout_s)[0]
        if outcome.timed_out:
            raise TimeoutError
        if outcome.error is not None:
            raise outcome.error
        return outcome.value


class RewardWorkerPool:
    """Shards a batch across ``num_workers`` :class:`RewardWorker` s and returns results in input order.

    With ``use_ray=True`` the workers are Ray actors (``ray.init`` must have been called by the caller) that
    score their shards in parallel; with ``use_ray=False`` a single in-process worker scores the whole batch
    (single-process debug mode).

    Args:
        num_workers: number of Ray actors (ignored in-process).
        use_ray: run the workers as Ray actors.
        num_cpus_per_worker: CPUs each actor reserves.
        reward_options: see :class:`RewardWorker`.
        tag_to_reward: see :class:`RewardWorker`.
        timeout_s: see :class:`RewardWorker`.
    """

    def __init__(
        self,
        num_workers: int,
        use_ray: bool = True,
        *,
        num_cpus_per_worker: float = 1.0,
        reward_options: Mapping[str, Mapping[str, Any]] | None = None,
        tag_to_reward: Mapping[str, str] | None = None,
        timeout_s: float = 0.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.use_ray = use_ray
        if not use_ray:
            self._local = RewardWorker(reward_options, tag_to_reward, timeout_s=timeout_s)
            self._actors: list[Any] = []
            return
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RewardWorkerPool(use_ray=True) needs ray.init() first, or pass use_ray=False")
        actor_cls = ray.remote(num_cpus=num_cpus_per_worker)(RewardWorker)
        user = user_registered_rewards()
        self._actors = [actor_cls.remote(reward_options, tag_to_reward, user, timeout_s) for _ in range(num_workers)]

    def compute(self, responses: list[str], ground_truths: list[str], tags: list[str]) -> list[RewardResult]:
        """Score the batch (see :meth:`RewardWorker.compute`); shards are contiguous, results keep input order."""
        if not self.use_ray:
            return self._local.compute(responses, ground_truths, tags)
        import ray

        if not len(responses) == len(ground_truths) == len(tags):
            raise ValueError(
                f"responses, ground_truths and tags must have one entry per sample; got lengths "
                f"{len(responses)}, {len(ground_truths)}, {len(tags)}"
            )
        n, k = len(responses), len(self._actors)
        bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]  # contiguous shards, sizes differ by <= 1
        futures = [
            actor.compute.remote(responses[lo:hi], ground_truths[lo:hi], tags[lo:hi])
            for actor, (lo, hi) in zip(self._actors, bounds)
            if hi > lo
        ]
        return [result for shard in ray.get(futures) for result in shard]

    def shutdown(self) -> None:
        """Kill the Ray actors (no-op in-process)."""
        if self._actors:
            import ray

            for actor in self._actors:
                ray.kill(actor)
            self._actors = []
