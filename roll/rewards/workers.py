"""Reward workers: score batches of responses with registered rule rewards, in-process or as Ray actors."""

from __future__ import annotations

from typing import Any, Mapping

from roll.rewards import math_answer  # noqa: F401  (registers the built-in "math" reward)
from roll.rewards.registry import RewardResult, get_reward_fn, register_reward

__all__ = ["RewardWorker", "RewardWorkerPool", "register_reward"]


class RewardWorker:
    """Scores responses with the reward function registered for each sample's tag.

    Args:
        reward_options: keyword options per reward name, e.g. ``{"math": {"format_reward": 0.1}}``.
        tag_to_reward: maps a data tag to a reward name (``{"gsm8k": "math"}``); a tag not listed is used as
            the reward name itself.
    """

    def __init__(
        self,
        reward_options: Mapping[str, Mapping[str, Any]] | None = None,
        tag_to_reward: Mapping[str, str] | None = None,
    ) -> None:
        self.reward_options = {name: dict(opts) for name, opts in (reward_options or {}).items()}
        self.tag_to_reward = dict(tag_to_reward or {})
        for name in [*self.reward_options, *self.tag_to_reward.values()]:
            get_reward_fn(name)  # fail at construction, listing the valid names, not mid-training

    def compute(self, responses: list[str], ground_truths: list[str], tags: list[str]) -> list[RewardResult]:
        """Score ``responses[i]`` against ``ground_truths[i]`` with the reward for ``tags[i]``; order is kept.

        Raises:
            ValueError: if the three lists differ in length.
            KeyError: if a tag maps to no registered reward (the message lists the registered ones).
        """
        if not len(responses) == len(ground_truths) == len(tags):
            raise ValueError(
                f"responses, ground_truths and tags must have one entry per sample; got lengths "
                f"{len(responses)}, {len(ground_truths)}, {len(tags)}"
            )
        results = []
        for response, truth, tag in zip(responses, ground_truths, tags):
            name = self.tag_to_reward.get(tag, tag)
            results.append(get_reward_fn(name)(response, truth, **self.reward_options.get(name, {})))
        return results


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
    """

    def __init__(
        self,
        num_workers: int,
        use_ray: bool = True,
        *,
        num_cpus_per_worker: float = 1.0,
        reward_options: Mapping[str, Mapping[str, Any]] | None = None,
        tag_to_reward: Mapping[str, str] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.use_ray = use_ray
        if not use_ray:
            self._local = RewardWorker(reward_options, tag_to_reward)
            self._actors: list[Any] = []
            return
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RewardWorkerPool(use_ray=True) needs ray.init() first, or pass use_ray=False")
        actor_cls = ray.remote(num_cpus=num_cpus_per_worker)(RewardWorker)
        self._actors = [actor_cls.remote(reward_options, tag_to_reward) for _ in range(num_workers)]

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
