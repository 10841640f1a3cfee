"""Tests for roll.rewards.workers: registry, in-process worker, and the Ray-actor pool (one Ray session)."""

from pathlib import Path

import pytest

from roll.rewards.registry import RewardResult, get_reward_fn, register_reward, registered_rewards
from roll.rewards.workers import RewardWorker, RewardWorkerPool

RESPONSES = ["\\boxed{4}", "#### 1,000", "<answer>7</answer>", "it is 3", "no idea", "\\boxed{\\frac{1}{2}}"]
TRUTHS = ["4", "1000", "8", "3", "1", "0.5"]
CORRECT = [True, True, False, True, False, True]


def test_registry_rejects_duplicates_and_lists_names():
    assert "math" in registered_rewards()
    with pytest.raises(ValueError, match="already registered"):
        register_reward("math")(lambda response, ground_truth: None)
    with pytest.raises(KeyError, match=r"unknown reward 'nope'.*'math'"):
        get_reward_fn("nope")


def test_worker_in_process_with_options_and_tag_mapping():
    worker = RewardWorker(reward_options={"math": {"format_reward": 0.5}}, tag_to_reward={"gsm8k": "math"})
    results = worker.compute(RESPONSES, TRUTHS, ["gsm8k", "math", "math", "math", "math", "gsm8k"])
    assert [r.correct for r in results] == CORRECT
    assert [r.score for r in results] == [1.5, 1.5, 0.5, 1.0, 0.0, 1.5]
    assert all(isinstance(r, RewardResult) for r in results)


def test_worker_errors():
    with pytest.raises(KeyError, match="unknown reward .gsm.; valid names"):
        RewardWorker(tag_to_reward={"gsm8k": "gsm"})
    with pytest.raises(ValueError, match="lengths 1, 2, 1"):
        RewardWorker().compute(["a"], ["1", "2"], ["math"])
    with pytest.raises(KeyError, match="unknown reward 'chess'"):
        RewardWorker().compute(["a"], ["1"], ["chess"])


def test_pool_in_process_debug_mode():
    pool = RewardWorkerPool(num_workers=3, use_ray=False)
    assert [r.correct for r in pool.compute(RESPONSES, TRUTHS, ["math"] * 6)] == CORRECT


@pytest.mark.slow
def test_pool_on_ray_shards_and_keeps_order(ray_session):
    pool = RewardWorkerPool(num_workers=2, num_cpus_per_worker=1, reward_options={"math": {"format_reward": 0.25}})
    try:
        # 7 samples over 2 actors: uneven shards (3 + 4) must come back in input order
        responses = RESPONSES + ["\\boxed{-2}"]
        truths = TRUTHS + ["-2"]
        results = pool.compute(responses, truths, ["math"] * 7)
        assert [r.correct for r in results] == CORRECT + [True]
        assert [r.extracted for r in results] == ["4", "1,000", "7", "3", None, "\\frac{1}{2}", "-2"]
        assert results[2].score == 0.25 and results[6].score == 1.25
        assert pool.compute(["\\boxed{1}"], ["1"], ["math"])[0].correct  # fewer samples than actors
    finally:
        pool.shutdown()


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), None])
def test_non_finite_score_is_named_at_its_source(bad):
    from roll.rewards import registry
    from roll.rewards.workers import NonFiniteReward

    name = "test_nan_reward"
    register_reward(name)(
        lambda response, ground_truth: RewardResult(bad if response == "x" else 1.0, False, None, False)
    )
    try:
        worker = RewardWorker()
        assert [r.score for r in worker.compute(["a", "b"], ["", ""], [name] * 2)] == [1.0, 1.0]
        with pytest.raises(NonFiniteReward) as info:
            worker.compute(["a", "x"], ["", ""], [name] * 2)
    finally:
        registry.REWARDS.unregister(name)
    line = next(
        i
        for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
        if "lambda response, ground_truth: RewardResult(bad" in text
    )
    assert str(info.value) == (
        f"reward function {name!r} (test_non_finite_score_is_named_at_its_source.<locals>."
        f"<lambda> defined at {__file__}:{line}) returned score={bad!r} for sample 1 (tag "
        f"{name!r}, response 'x'); a reward must return RewardResult with a finite float score"
    )


def _never_returns(response: str, ground_truth: str) -> RewardResult:
    """A user reward with a bug: a blocking wait without a timeout on the response "wait"."""
    import threading

    if response == "wait":
        threading.Event().wait()
    return RewardResult(1.0, True, response, True)


def _hang_message(line_of_def: int) -> str:
    return (
        f"reward function 'test_hang_reward' (_never_returns defined at {__file__}:{line_of_def}) did not return "
        f"within rewards.timeout_s=0.5s for sample 1 (tag 'test_hang_reward', response 'wait')"
    )


@pytest.fixture
def hang_reward():
    from roll.rewards import registry

    register_reward("test_hang_reward")(_never_returns)
    yield "test_hang_reward"
    registry.REWARDS.unregister("test_hang_reward")


def test_a_reward_that_never_returns_is_abandoned_at_its_deadline(hang_reward):
    from roll.rewards.workers import RewardTimeout

    worker = RewardWorker(timeout_s=0.5)
    assert [r.score for r in worker.compute(["a"], [""], [hang_reward])] == [1.0]
    with pytest.raises(RewardTimeout) as info:
        worker.compute(["a", "wait", "b"], ["", "", ""], [hang_reward] * 3)
    assert str(info.value) == _hang_message(_never_returns.__code__.co_firstlineno)
    assert worker.compute(["c"], [""], [hang_reward])[0].score == 1.0  # the worker still scores afterwards


@pytest.mark.slow
def test_a_reward_that_never_returns_under_ray(ray_session, hang_reward):
    from roll.rewards.workers import RewardTimeout

    pool = RewardWorkerPool(num_workers=1, num_cpus_per_worker=0.5, timeout_s=0.5)
    try:
        with pytest.raises(RewardTimeout) as info:  # Ray's error is also an instance of the raised type
            pool.compute(["a", "wait"], ["", ""], [hang_reward] * 2)
    finally:
        pool.shutdown()
    assert _hang_message(_never_returns.__code__.co_firstlineno) in str(info.value)
