"""The token layout (roll.data.layout) against hand-written positions: spans, masks, score places, rollout
log-probs, for a multi-turn trajectory and for single-turn (RLVR) samples."""

import torch

from roll.data.layout import (
    last_response_index,
    loss_mask,
    place_at_last_response,
    prompt_response_batch,
    rollout_log_probs,
    sample_layouts,
    trajectories_to_batch,
)
from roll.data.trajectory import Trajectory, Turn


def two_turn_trajectory() -> Trajectory:
    """Prompt [1, 2], reply [3, 4] (stopped); observation [5], reply [6, 7] + appended end token 9 (length cut)."""
    turns = [
        Turn([1, 2], [3, 4], [-0.1, -0.2], "s0", reward=0.5),
        Turn([5], [6, 7, 9], [-0.3, -0.4], "s1", reward=1.0, appended_eos=True),
    ]
    return Trajectory("t", env_id=0, group_id=3, tag="x", seed=0, turns=turns)


def test_trajectory_layout_positions():
    [layout] = sample_layouts(two_turn_trajectory())
    # token positions: 0:1 1:2 2:3 3:4 4:5 5:6 6:7 7:9
    assert layout.ids == [1, 2, 3, 4, 5, 6, 7, 9]
    assert layout.response_mask == [0, 0, 1, 1, 0, 1, 1, 0]  # the appended end token is not trained on
    # tokens 2, 3 are scored at log-prob indices 1, 2; tokens 5, 6 at 4, 5
    assert layout.turn_spans == [(1, 3), (4, 6)]


def test_batch_masks_scores_and_metadata():
    short = Trajectory("u", env_id=1, group_id=3, tag="x", seed=0, turns=[Turn([1], [8], [-0.5], "s0", reward=-1.0)])
    batch = trajectories_to_batch([two_turn_trajectory(), short], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 9], [1, 8, 0, 0, 0, 0, 0, 0]]
    assert batch["attention_mask"][1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert loss_mask(batch["response_mask"]).tolist() == [[0, 1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0]]
    # score 1.5 of the first episode on its last generated token (position 6 -> index 5); -1 at index 0
    expected = torch.zeros(2, 7)
    expected[0, 5], expected[1, 0] = 1.5, -1.0
    torch.testing.assert_close(batch["token_level_scores"], expected)
    assert batch["turn_spans"] == [[(1, 3), (4, 6)], [(0, 1)]]
    assert batch["turn_states"] == [["s0", "s1"], ["s0"]] and batch["step_rewards"] == [[0.5, 1.0], [-1.0]]


def test_single_turn_batch():
    batch = prompt_response_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], [1.0, -0.5], pad_id=0)
    assert batch["response_mask"].tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    assert batch["token_level_scores"].tolist() == [[0, 0, 0, 1.0], [0, 0, -0.5, 0]]


def test_last_index_and_placement_without_responses():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.float32)
    assert last_response_index(mask).tolist() == [2, -1]
    assert place_at_last_response(torch.tensor([3.0, 4.0]), mask).tolist() == [[0, 0, 3.0, 0], [0, 0, 0, 0]]


def test_rollout_log_probs_follow_the_spans():
    values, mask = rollout_log_probs([two_turn_trajectory()], width=8)
    assert mask.tolist() == [[0, 1, 1, 0, 1, 1, 0]]
    torch.testing.assert_close(values, torch.tensor([[0, -0.1, -0.2, 0, -0.3, -0.4, 0]]))


def test_sample_images_follow_the_samples_tokens():
    """Each sample's images are those of its tokens, in order: a ``traj`` sample's turns'; a ``step`` sample's the
    context's too (its prompt is the whole engine prompt); a turn that starts a sample drops the earlier ones."""
    import numpy as np

    from roll.data.layout import sample_images

    a, b, c = (np.full((2, 2, 3), v, dtype=np.uint8) for v in (1, 2, 3))
    turns = [
        Turn([1], [2], [0.0], "", images=[a]),
        Turn([3], [4], [0.0], "", images=[b]),
        Turn([5], [6], [0.0], "", starts_sample=True, images=[c]),
    ]
    traj = Trajectory("t", 0, 0, "x", 0, turns)

    def values(samples):
        return [[int(im[0, 0, 0]) for im in sample] for sample in samples]

    assert values(sample_images(traj)) == [[1, 2], [3]]
    assert values(sample_images(traj, "step")) == [[1], [1, 2], [3]]
    assert [int(im[0, 0, 0]) for im in traj.sample_images()] == [3]
    batch = trajectories_to_batch([traj], pad_id=0, mode="step")
    assert values(batch["images"]) == [[1], [1, 2], [3]]
    assert "images" not in trajectories_to_batch([Trajectory("u", 0, 0, "x", 0, [Turn([1], [2], [0.0], "")])], 0)
