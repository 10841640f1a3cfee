"""RLVR batch layout (hand-checked positions) and rollout metrics."""

import torch

from roll.data.layout import prompt_response_batch as build_batch
from roll.data.rlvr_dataset import RLVRExample
from roll.pipelines.rlvr_pipeline import PromptGroup, groups_to_batch, rollout_metrics
from roll.ppo.loss_fns import loss_mask

PAD = 0


def test_build_batch_layout():
    batch = build_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], [1.0, -0.5], PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 9, 10], [8, 11, 12, 13, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch["response_mask"].tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    # token_level_scores index t scores token t + 1: the last response token of row 0 is position 4 -> index 3
    assert batch["token_level_scores"].tolist() == [[0, 0, 0, 1.0], [0, 0, -0.5, 0]]
    assert batch["scores"].tolist() == [1.0, -0.5]
    # the score sits on the last position of the loss mask (what compute_advantages assumes)
    mask = loss_mask(batch)
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]


def group(index, scores, correct, lengths, truncated=None):
    ids = [[1] * n for n in lengths]
    return PromptGroup(
        index,
        [7, 7],
        ids,
        ["x"] * len(scores),
        scores,
        correct,
        [True] * len(scores),
        truncated or [False] * len(scores),
    )


def test_groups_to_batch_and_metrics():
    examples = [RLVRExample("a", "1", "math", 0), RLVRExample("b", "2", "logic", 1)]
    groups = [group(1, [1.0, 0.0], [True, False], [2, 3], [False, True]), group(0, [1.0, 1.0], [True, True], [1, 1])]
    batch = groups_to_batch(groups, examples, PAD)
    assert batch["group_id"] == [0, 0, 1, 1] and batch["prompt_index"] == [1, 1, 0, 0]
    assert batch["tag"] == ["logic", "logic", "math", "math"]
    assert batch["input_ids"].shape == (4, 5) and int(batch["response_mask"].sum()) == 7
    m = rollout_metrics(groups, examples, "rollout")
    assert m["rollout/accuracy"] == 0.75 and m["rollout/mean_reward"] == 0.75
    assert m["rollout/logic/accuracy"] == 0.5 and m["rollout/math/accuracy"] == 1.0
    assert m["rollout/response_length"] == 7 / 4 and m["rollout/truncated_rate"] == 0.25
    assert m["rollout/zero_std_groups"] == 0.5


def test_grpo_advantages_on_rlvr_batch():
    """GRPO through the shared advantage step: group of (1, 0) -> +-0.7071 on every response token."""
    from roll.config.rlvr import RLVRConfig
    from roll.ppo.advantage_step import compute_advantages

    batch = build_batch([[5, 6]] * 4, [[9, 10], [9], [9, 10, 11], [9]], [1.0, 0.0, 1.0, 1.0], PAD)
    gids = torch.tensor([0, 0, 1, 1])
    compute_advantages(RLVRConfig(), batch, batch["scores"], gids, 0.0)
    adv, mask = batch["advantages"], loss_mask(batch)
    # group 0: mean 0.5, sample std 0.7071 -> +0.7071 / -0.7071; group 1 all equal -> 0
    assert torch.allclose(adv[0][mask[0].bool()], torch.full((2,), 0.70710), atol=1e-3)
    assert torch.allclose(adv[1][mask[1].bool()], torch.full((1,), -0.70710), atol=1e-3)
    assert adv[2:].abs().max() == 0 and (adv * (1 - mask)).abs().max() == 0
