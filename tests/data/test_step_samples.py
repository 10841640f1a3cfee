"""Samples of episodes (roll.data.layout): ``trajectory_mode`` traj and step, turns that start a sample (template
breaks), the episode frame the advantages run in, and the episode loss weights of roll.algorithms.aggregation,
against hand-written positions and hand-computed numbers."""

import pytest
import torch

from roll.algorithms.aggregation import agg_loss, episode_token_weights
from roll.data.layout import (
    episode_rows,
    episode_view,
    from_episode_frame,
    loss_mask,
    rollout_log_probs,
    sample_layouts,
    several_samples,
    to_episode_frame,
    trajectories_to_batch,
)
from roll.data.trajectory import Trajectory, Turn


def append_only() -> Trajectory:
    """Prompt [1, 2], reply [3, 4]; observation [5], reply [6, 7] + appended end token 9 (length cut)."""
    turns = [
        Turn([1, 2], [3, 4], [-0.1, -0.2], "s0", reward=0.5),
        Turn([5], [6, 7, 9], [-0.3, -0.4], "s1", reward=1.0, appended_eos=True),
    ]
    return Trajectory("t", env_id=0, group_id=3, tag="x", seed=0, turns=turns)


def with_break() -> Trajectory:
    """Turn 3 was given a re-rendered prompt (the template rewrote the history): it starts a sample."""
    turns = [
        Turn([1, 2], [3], [-0.1], "s0"),
        Turn([4], [5], [-0.2], "s1"),
        Turn([1, 2, 8, 4], [6, 7], [-0.3, -0.4], "s2", reward=2.0, starts_sample=True),
    ]
    return Trajectory("b", env_id=1, group_id=3, tag="x", seed=0, turns=turns)


def test_token_ids_and_pending_ids_follow_the_current_sample():
    traj = with_break()
    assert traj.token_ids() == [1, 2, 8, 4, 6, 7]  # from the turn that starts a sample on
    assert traj.pending_ids([9]) == [1, 2, 8, 4, 6, 7, 9]
    assert traj.pending_ids([1, 9], starts_sample=True) == [1, 9]
    assert traj.template_breaks == 1 and append_only().template_breaks == 0
    assert append_only().token_ids() == [1, 2, 3, 4, 5, 6, 7, 9]


def test_traj_mode_splits_at_template_breaks():
    first, second = sample_layouts(with_break(), "traj")
    assert (first.ids, first.response_mask) == ([1, 2, 3, 4, 5], [0, 0, 1, 0, 1])
    assert (second.ids, second.response_mask) == ([1, 2, 8, 4, 6, 7], [0, 0, 0, 0, 1, 1])
    batch = trajectories_to_batch([append_only(), with_break()], pad_id=0)
    assert batch["episode"] == [0, 1, 1] and batch["traj_id"] == ["t", "b", "b"]
    assert batch["episode_fraction"].tolist() == [1.0, 0.5, 0.5]
    assert batch["scores"].tolist() == [1.5, 2.0, 2.0]  # every sample carries its episode's score
    assert batch["turn_spans"] == [[(1, 3), (4, 6)], [(1, 2), (3, 4)], [(3, 5)]]
    assert batch["step_rewards"] == [[0.5, 1.0], [0.0, 0.0], [2.0]]
    values, mask = rollout_log_probs([with_break()], width=6)  # the engine's log-probs follow the samples
    torch.testing.assert_close(values, torch.tensor([[0, -0.1, 0, -0.2, 0], [0, 0, 0, -0.3, -0.4]]))
    assert mask.tolist() == [[0, 1, 0, 1, 0], [0, 0, 0, 1, 1]]


def test_step_mode_one_sample_per_turn_with_the_engine_prompt():
    first, second = sample_layouts(append_only(), "step")
    assert (first.ids, first.response_mask) == ([1, 2, 3, 4], [0, 0, 1, 1])
    # the second turn's prompt: everything the engine was given (first prompt, first reply, observation)
    assert (second.ids, second.response_mask) == ([1, 2, 3, 4, 5, 6, 7, 9], [0, 0, 0, 0, 0, 1, 1, 0])
    assert [s.ids for s in sample_layouts(with_break(), "step")] == [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 8, 4, 6, 7]]
    values, mask = rollout_log_probs([append_only()], width=8, mode="step")
    assert mask.tolist() == [[0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 0]]
    torch.testing.assert_close(values[1], torch.tensor([0, 0, 0, 0, -0.3, -0.4, 0]))
    with pytest.raises(ValueError, match="trajectory_mode='turn'.*traj, step"):
        sample_layouts(append_only(), "turn")


def test_traj_mode_without_breaks_is_one_sample_per_episode():
    batch = trajectories_to_batch([append_only(), append_only()], pad_id=0)
    assert not several_samples(batch) and episode_rows(batch) == [[0], [1]]
    assert several_samples(trajectories_to_batch([append_only()], 0, "step"))


def test_episode_frame_round_trip_and_view():
    batch = trajectories_to_batch([append_only(), with_break()], pad_id=0, mode="step")
    rows = episode_rows(batch)
    assert rows == [[0, 1], [2, 3, 4]]
    x = torch.arange(5 * 5, dtype=torch.float32).view(5, 5)
    frame = to_episode_frame(x, rows)
    assert frame.shape == (2, 15) and frame[0, 5:10].tolist() == x[1].tolist() and frame[0, 10:].sum() == 0
    torch.testing.assert_close(from_episode_frame(frame, rows, 5), x)
    view = episode_view(batch)
    assert view["scores"].tolist() == [1.5, 2.0] and view["traj_id"] == ["t", "b"]
    # samples are 8 tokens wide (7 log-prob positions): episode 0's second turn (tokens 5, 6 of its sample ->
    # indices 4, 5) sits in the second block, at +7
    assert view["turn_spans"][0] == [(1, 3), (7 + 4, 7 + 6)]
    assert view["step_rewards"] == [[0.5, 1.0], [0.0, 0.0, 2.0]]
    mask = loss_mask(view["response_mask"])
    assert mask[0].nonzero().flatten().tolist() == [1, 2, 11, 12]
    assert view["token_level_scores"][0].nonzero().flatten().tolist() == [12]  # the episode's last reply token


def test_episode_token_weights_hand_computed():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    # seq-mean-token-mean: 1 / the episode's tokens; token-sum: 1; token-sum-norm: 1 / norm_len
    torch.testing.assert_close(
        episode_token_weights(mask, "seq-mean-token-mean"), torch.tensor([[1 / 3] * 3 + [0], [1, 0, 0, 0], [0] * 4])
    )
    assert episode_token_weights(mask, "seq-mean-token-sum").tolist() == mask.tolist()
    assert episode_token_weights(mask, "seq-mean-token-sum-norm", 8).tolist() == (mask / 8).tolist()
    with pytest.raises(ValueError, match="averages over tokens"):
        episode_token_weights(mask, "token-mean")


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_split_episode_with_weights_aggregates_like_the_episode(mode):
    """Episode 0 = 3 tokens in two samples (2 + 1), episode 1 = 1 token: sum(l W) / sum(f) with f = 1/samples
    equals the mode over the episodes, and differs from treating each sample as a sequence."""
    loss = torch.tensor([[2.0, 4.0, 0.0], [6.0, 0.0, 0.0], [10.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    rows = [[0, 1], [2]]
    fractions = torch.tensor([0.5, 0.5, 1.0])
    weights = from_episode_frame(episode_token_weights(to_episode_frame(mask, rows), mode, 4), rows, 3)
    episodes = agg_loss(to_episode_frame(loss, rows), to_episode_frame(mask, rows), mode, 4)
    hand = {
        "seq-mean-token-mean": (12 / 3 + 10) / 2,
        "seq-mean-token-sum": (12 + 10) / 2,
        "seq-mean-token-sum-norm": (12 / 4 + 10 / 4) / 2,
    }[mode]
    assert float(episodes) == pytest.approx(hand)
    assert float((loss * weights).sum() / fractions.sum()) == pytest.approx(hand)
    assert float(agg_loss(loss, mask, mode, 4)) != pytest.approx(hand)  # per-sample: not the episode loss
