"""Score normalization (agentic) and RLVR reward post-processing, against hand-computed values."""

import math

import pytest
import torch

from roll.algorithms.groups import group_stats
from roll.algorithms.reward_norm import RunningMeanStd, normalize_scores, postprocess_rlvr_rewards

# groups: {1, 2, 3} (mean 2, sample std 1), {5, 5} (constant), {7} (alone)
SCORES = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 7.0])
GROUPS = torch.tensor([10, 10, 10, -3, -3, 42])


def test_group_stats():
    stats = group_stats(SCORES, GROUPS)
    torch.testing.assert_close(stats.mean, torch.tensor([2.0, 2, 2, 5, 5, 7]))
    torch.testing.assert_close(stats.std, torch.tensor([1.0, 1, 1, 0, 0, 0]))
    torch.testing.assert_close(stats.count, torch.tensor([3.0, 3, 3, 2, 2, 1]))
    # population std of {1,2,3}: sqrt(2/3)
    assert group_stats(SCORES, GROUPS, unbiased=False).std[0].item() == pytest.approx(math.sqrt(2 / 3))


def test_identity_and_mean():
    torch.testing.assert_close(normalize_scores(SCORES, GROUPS, "identity"), SCORES)
    torch.testing.assert_close(normalize_scores(SCORES, GROUPS, "mean"), torch.tensor([-1.0, 0, 1, 0, 0, 0]))


def test_mean_std_zero_for_constant_and_singleton_groups():
    out = normalize_scores(SCORES, GROUPS, "mean_std")
    d = 1 / (1 + 1e-6)  # (s - 2) / (1 + 1e-6)
    torch.testing.assert_close(out, torch.tensor([-d, 0, d, 0, 0, 0]))


def test_none_group_ids_is_whole_batch():
    # batch {1,3,5,7}: mean 4, sample std sqrt(20/3)
    s = torch.tensor([1.0, 3.0, 5.0, 7.0])
    std = math.sqrt(20 / 3)
    expected = (s - 4) / (std + 1e-6)
    torch.testing.assert_close(normalize_scores(s, None, "mean_std"), expected)


def test_asym_clip():
    # group A: one 1 and fifteen 0s: mean 1/16, sample std 1/4 -> z = 3.75 (clamped to 3) and -0.25
    # group B: one 0 and fifteen 1s: z = -3.75 (clamped to -1) and +0.25
    a = torch.tensor([1.0] + [0.0] * 15)
    s = torch.cat([a, 1 - a])
    g = torch.tensor([0] * 16 + [1] * 16)
    out = normalize_scores(s, g, "asym_clip")
    expected = torch.tensor([3.0] + [-0.25] * 15 + [-1.0] + [0.25] * 15)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_unknown_method_lists_valid_names():
    with pytest.raises(KeyError, match="asym_clip.*identity.*mean.*mean_std"):
        normalize_scores(SCORES, GROUPS, "zscore")


def test_bad_group_ids():
    with pytest.raises(ValueError, match=r"shape \(6,\)"):
        normalize_scores(SCORES, torch.tensor([0, 1]), "mean")
    with pytest.raises(TypeError, match="integer"):
        normalize_scores(SCORES, GROUPS.float(), "mean")


R = torch.tensor([1.0, 3.0, 5.0, 7.0])
RG = torch.tensor([0, 0, 1, 1])
BATCH_STD = math.sqrt(20 / 3)  # sample std of {1,3,5,7}


@pytest.mark.parametrize(
    "shift,scale,expected",
    [
        (False, False, (R - 4) / (BATCH_STD + 1e-6)),  # neither flag: full standardization
        (True, True, (R - 4) / (BATCH_STD + 1e-6)),
        (True, False, R - 4),
        (False, True, R / (BATCH_STD + 1e-6)),
    ],
)
def test_rlvr_batch(shift, scale, expected):
    out = postprocess_rlvr_rewards(R, RG, reward_norm="batch", reward_shift=shift, reward_scale=scale, reward_clip=None)
    torch.testing.assert_close(out, expected)


def test_rlvr_group_and_clip():
    # groups {1,3} and {5,7}: means 2 and 6, sample std sqrt(2)
    d = 1 / (math.sqrt(2) + 1e-6)
    kw = dict(reward_norm="group", reward_shift=False, reward_scale=False)
    torch.testing.assert_close(postprocess_rlvr_rewards(R, RG, reward_clip=None, **kw), torch.tensor([-d, d, -d, d]))
    torch.testing.assert_close(postprocess_rlvr_rewards(R, RG, reward_clip=0.5, **kw), torch.tensor([-0.5, 0.5] * 2))
    # no normalization, clip only
    out = postprocess_rlvr_rewards(R, None, reward_norm=None, reward_shift=False, reward_scale=False, reward_clip=4.0)
    torch.testing.assert_close(out, torch.tensor([1.0, 3.0, 4.0, 4.0]))


def test_rlvr_running():
    running = RunningMeanStd()
    kw = dict(reward_norm="running", reward_shift=False, reward_scale=False, reward_clip=None, running=running)
    # after {1,3,5,7}: mean 4, population std sqrt(5)
    out = postprocess_rlvr_rewards(R, None, **kw)
    torch.testing.assert_close(out, (R - 4) / (math.sqrt(5) + 1e-6))
    # add 9: {1,3,5,7,9}: mean 5, population var 8
    out = postprocess_rlvr_rewards(torch.tensor([9.0]), None, **kw)
    torch.testing.assert_close(out, torch.tensor([4 / (math.sqrt(8) + 1e-6)]))


def test_rlvr_errors():
    with pytest.raises(ValueError, match="reward_norm"):
        postprocess_rlvr_rewards(R, RG, reward_norm=None, reward_shift=True, reward_scale=False, reward_clip=None)
    with pytest.raises(ValueError, match="RunningMeanStd"):
        postprocess_rlvr_rewards(R, RG, reward_norm="running", reward_shift=False, reward_scale=False, reward_clip=None)
    with pytest.raises(ValueError, match="group_ids"):
        postprocess_rlvr_rewards(R, None, reward_norm="group", reward_shift=False, reward_scale=False, reward_clip=None)
    with pytest.raises(
        ValueError, match="unknown reward_norm 'prompt'; valid: 'batch', 'group', (.*, )?'running' or None"
    ):
        postprocess_rlvr_rewards(R, RG, reward_norm="prompt", reward_shift=False, reward_scale=False, reward_clip=None)


def test_running_mean_std_matches_full_data_and_round_trips():
    torch.manual_seed(0)
    data = torch.randn(1000, dtype=torch.float64) * 3 + 2
    rms = RunningMeanStd()
    assert (rms.mean, rms.std) == (0.0, 1.0)
    for chunk in data.split(77):
        rms.update(chunk)
    assert rms.count == 1000
    assert rms.mean == pytest.approx(data.mean().item())
    assert rms.std == pytest.approx(data.std(unbiased=False).item())
    clone = RunningMeanStd()
    clone.load_state_dict(rms.state_dict())
    clone.update(torch.tensor([1.0]))
    rms.update(torch.tensor([1.0]))
    assert (clone.mean, clone.std, clone.count) == (rms.mean, rms.std, rms.count)
