"""Train-inference mismatch metric: engine log-probs aligned with ``old_log_probs`` (hand-computed positions)."""

from __future__ import annotations

import pytest
import torch

from roll.data.layout import prompt_response_batch, response_log_probs, rollout_log_probs, trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn
from roll.pipelines.step_metrics import logprob_mismatch


def _trajs():
    a = Trajectory(
        "a",
        0,
        0,
        "S",
        1,
        turns=[
            Turn(prompt_ids=[1, 2], response_ids=[3, 4], response_log_probs=[-0.1, -0.2], observation=""),
            Turn(prompt_ids=[5], response_ids=[6, 9], response_log_probs=[-0.3], observation="", appended_eos=True),
        ],
    )
    b = Trajectory(
        "b",
        1,
        0,
        "S",
        1,
        turns=[
            Turn(prompt_ids=[1, 2, 7], response_ids=[8], response_log_probs=[-0.5], observation=""),
        ],
    )
    return [a, b]


def test_rollout_log_probs_alignment():
    # a = [1, 2, 3, 4, 5, 6, 9]: tokens 3, 4 at positions 2, 3 -> log-prob indices 1, 2; token 6 at 5 -> index 4;
    # 9 is an appended end-of-turn token (no engine log-prob). b = [1, 2, 7, 8]: token 8 at 3 -> index 2.
    values, mask = rollout_log_probs(_trajs(), width=7)
    assert mask.tolist() == [[0, 1, 1, 0, 1, 0], [0, 0, 1, 0, 0, 0]]
    assert values[0].tolist() == pytest.approx([0, -0.1, -0.2, 0, -0.3, 0])
    assert values[1, 2].item() == pytest.approx(-0.5)


def test_mismatch_metric_hand_computed():
    trajs = _trajs()
    batch = trajectories_to_batch(trajs, pad_id=0)
    old = torch.zeros(2, 6)
    old[0, 1], old[0, 2], old[0, 4], old[1, 2] = -0.1, -0.4, -0.3, -1.0  # |diffs| = 0, 0.2, 0, 0.5
    old[0, 5] = -9.0  # not a generated token with an engine log-prob: ignored
    batch["old_log_probs"] = old
    batch["rollout_log_probs"], batch["rollout_log_prob_mask"] = rollout_log_probs(trajs, 7)
    m = logprob_mismatch(batch)
    assert m["rollout/logprob_mismatch"] == pytest.approx(0.7 / 4)
    assert m["rollout/logprob_mismatch_max"] == pytest.approx(0.5)


def test_single_turn_log_probs_and_mismatch():
    # prompts [1, 2, 3] and [4]; responses [5, 6] and [7, 8, 9]: width 5. Response tokens of sample 0 sit at
    # positions 3, 4 -> log-prob indices 2, 3; of sample 1 at 1, 2, 3 -> indices 0, 1, 2.
    batch = prompt_response_batch([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], [1.0, 0.0], pad_id=0)
    values, mask = response_log_probs([3, 1], [[-0.1, -0.2], [-0.3, -0.4, -0.5]], width=5)
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert torch.equal(mask, batch["response_mask"][:, 1:].float())  # exactly the loss mask
    assert values[0].tolist() == pytest.approx([0, 0, -0.1, -0.2])
    batch["old_log_probs"] = torch.tensor([[0, 0, -0.1, -0.5], [-0.3, -0.4, -0.1, 0]])  # |diffs| 0, 0.3, 0, 0, 0.4
    batch["rollout_log_probs"], batch["rollout_log_prob_mask"] = values, mask
    m = logprob_mismatch(batch)
    assert m["rollout/logprob_mismatch"] == pytest.approx(0.7 / 5)
    assert m["rollout/logprob_mismatch_max"] == pytest.approx(0.4)


def test_no_engine_log_probs_gives_no_metric():
    batch = prompt_response_batch([[1]], [[2]], [0.0], pad_id=0)
    batch["old_log_probs"] = torch.zeros(1, 1)
    batch["rollout_log_probs"], batch["rollout_log_prob_mask"] = response_log_probs([1], [[]], width=2)
    assert logprob_mismatch(batch) == {}
