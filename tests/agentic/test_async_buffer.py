"""The group buffer of asynchronous rollouts (roll.rollout.buffer): admission by running + waiting groups,
oldest-first takes, staleness metrics, stale groups dropped and counted, the checkpoint drain, producer errors."""

from __future__ import annotations

import threading
import time

import pytest

from roll.rollout.buffer import Group, GroupBuffer, Producers


def _blocked(fn, wait_s: float = 0.2) -> bool:
    """Whether ``fn()`` is still blocked after ``wait_s`` (it runs on in a daemon thread)."""
    done = threading.Event()
    threading.Thread(target=lambda: (fn(), done.set()), daemon=True).start()
    return not done.wait(wait_s)


def test_admission_bounds_running_plus_waiting():
    buf = GroupBuffer(k=1, batch_groups=2)  # limit (1 + 1) x 2 = 4 groups
    assert buf.admit(2) == 0 and buf.admit(2) == 0
    assert _blocked(lambda: buf.admit(1))  # 4 running: a fifth would exceed the bound
    buf.put(2, [Group("a", 0, 3.0), Group("b", 0, 5.0)])  # 2 running + 2 waiting: still full
    buf2 = GroupBuffer(k=1, batch_groups=2)
    buf2.admit(2)
    buf2.put(2, [Group("a", 0, 3.0), Group("b", 0, 5.0)])
    taken, metrics = buf2.take(2)
    assert [g.items for g in taken] == ["a", "b"]
    # between the take and the sync of its weights the bound is k x batch = 2 groups
    assert buf2.limit == 2 and buf2.admit(2) == 0
    assert _blocked(lambda: buf2.admit(1))
    buf2.set_version(1)  # synced: (k + 1) x batch again, and new groups start under version 1
    assert buf2.limit == 4 and buf2.admit(1) == 1
    assert metrics["rollout/buffered_groups_peak"] == 2.0


def test_take_is_oldest_first_and_drops_what_is_staler_than_k():
    buf = GroupBuffer(k=1, batch_groups=2, version=3)
    buf.admit(4)
    # versions 1 (staleness 2 > k: dropped), 2, 3, 2 finishing in this order
    buf.put(4, [Group("v1", 1, 10.0), Group("v2a", 2, 4.0), Group("v3", 3, 6.0), Group("v2b", 2, 2.0)])
    taken, m = buf.take(2)
    assert [g.items for g in taken] == ["v2a", "v2b"]  # oldest version first, then finishing order
    assert m["rollout/staleness_mean"] == 1.0 and m["rollout/staleness_max"] == 1.0
    assert m["rollout/dropped_groups"] == 1.0 and m["rollout/dropped_episode_length"] == 10.0
    assert m["rollout/trained_episode_length"] == 3.0  # (4 + 2) / 2
    assert m["rollout/policy_version"] == 3.0
    buf.set_version(4)
    buf.admit(1)
    buf.put(1, [Group("v4", 4, 1.0)])
    taken, m = buf.take(2)
    assert [g.items for g in taken] == ["v3", "v4"]
    assert (m["rollout/staleness_mean"], m["rollout/staleness_max"], m["rollout/dropped_groups"]) == (0.5, 1.0, 0.0)
    assert "rollout/dropped_episode_length" not in m


def test_failed_groups_free_their_admission():
    buf = GroupBuffer(k=1, batch_groups=1)
    buf.admit(2)
    buf.put(2, [])  # both groups failed: nothing waits, nothing runs
    assert (buf.running, buf.waiting) == (0, []) and buf.admit(2) == 0


def test_producers_stay_within_the_bound_while_the_trainer_lags():
    """Fast producers, a slow trainer: running + waiting never exceeds (k + 1) x batch and no group is older than
    k when taken."""
    k, batch = 2, 2
    buf = GroupBuffer(k, batch)

    def produce(i, round_, version):
        time.sleep(0.005)
        return [Group((i, round_), version, 1.0)]

    producers = Producers(buf, produce, [1, 1, 1])
    try:
        for step in range(8):
            taken, m = buf.take(batch)
            assert m["rollout/staleness_max"] <= k
            assert m["rollout/buffered_groups_peak"] <= (k + 1) * batch
            time.sleep(0.03)  # training
            buf.set_version(step + 1)
    finally:
        producers.close()
    assert all(r > 0 for r in producers.rounds)


def test_drain_waits_for_running_groups_and_release_admits_again():
    buf = GroupBuffer(k=1, batch_groups=2)
    gate = threading.Event()

    def produce(i, round_, version):
        gate.wait()
        return [Group(round_, version, 1.0)]

    producers = Producers(buf, produce, [1])
    while buf.running == 0:
        time.sleep(0.01)
    state = {}
    assert _blocked(lambda: state.update(producers.state_dict(lambda x: x)))  # round 1 still running
    gate.set()
    while not state:
        time.sleep(0.01)
    assert state["rounds"] == [1] and [g["items"] for g in state["groups"]] == [1]
    assert _blocked(lambda: buf.admit(1))  # paused until the checkpoint is written
    buf.release()
    producers.close()
    restored = Producers.start(1, 2, 1, lambda i, r, v: [Group(r, v, 1.0)], [1], state)
    try:
        taken, _ = restored.buffer.take(2)
        assert [g.items for g in taken] == [1, 2]  # the saved group, then round 2 (rounds continue)
    finally:
        restored.close()


def test_a_producer_error_reaches_the_trainer():
    buf = GroupBuffer(k=1, batch_groups=1)

    def produce(i, round_, version):
        raise ValueError("env exploded")

    producers = Producers(buf, produce, [1])
    with pytest.raises(RuntimeError, match="producer failed: env exploded"):
        buf.take(1)
    producers.close()


def test_a_unit_that_can_never_be_admitted_is_refused():
    with pytest.raises(
        ValueError,
        match=r"async_generation_ratio=1: a producer starts 5 groups .* \(k \+ 1\) x the "
        r"batch's 2 groups",
    ):
        Producers.start(1, 2, 0, lambda i, r, v: [], [5])
