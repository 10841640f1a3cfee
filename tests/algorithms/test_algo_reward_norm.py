"""Score normalization (agentic) and RLVR reward post-processing, against hand-computed values."""

import math

import pytest
import torch

from roll.algorithms.groups import group_stats
from roll.algorithms.reward_norm import (
    SCORE_NORMS,
    RunningMeanStd,
    normalize_episode_scores,
    normalize_scores,
    postprocess_rlvr_rewards,
    register_score_norm,
    resolve_norm_types,
    scoped_norm,
)

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


# The batch of SCORES: mean M = 23/6; sample std S = sqrt(SS / 5), SS = 113 - 23^2/6 = 149/6, so S = sqrt(149/30).
M, S, E = 23 / 6, math.sqrt(149 / 30), 1e-6
D = 1 / (1 + E)  # a score 1 away from its group's mean, over the group's std 1


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


@pytest.mark.parametrize(
    "mean, std, expected",
    [
        (None, None, _t(1, 2, 3, 5, 5, 7)),
        ("group", None, _t(-1, 0, 1, 0, 0, 0)),  # the singleton {7} minus its own mean
        ("batch", None, _t(1 - M, 2 - M, 3 - M, 5 - M, 5 - M, 7 - M)),  # a singleton keeps s - M without a std
        # a std: {5, 5} (std 0) and the singleton {7} become 0
        (None, "group", _t(1 * D, 2 * D, 3 * D, 0, 0, 0)),
        ("group", "group", _t(-D, 0, D, 0, 0, 0)),
        ("batch", "group", _t((1 - M) * D, (2 - M) * D, (3 - M) * D, 0, 0, 0)),
        # the batch's std: {5, 5} has spread now; the singleton {7} is still 0 (ROLL: no peer to compare with)
        (None, "batch", _t(1 / (S + E), 2 / (S + E), 3 / (S + E), 5 / (S + E), 5 / (S + E), 0)),
        ("group", "batch", _t(-1 / (S + E), 0, 1 / (S + E), 0, 0, 0)),
        ("batch", "batch", _t(*[(x - M) / (S + E) for x in (1, 2, 3, 5, 5)], 0)),
    ],
)
def test_every_mean_and_std_scope(mean, std, expected):
    torch.testing.assert_close(scoped_norm(SCORES, GROUPS, mean, std), expected)


def test_scopes_of_a_constant_batch_and_of_one_group():
    flat = torch.full((4,), 2.0)
    for std in ("batch", "group"):
        torch.testing.assert_close(scoped_norm(flat, torch.tensor([0, 0, 1, 1]), "batch", std), torch.zeros(4))
    torch.testing.assert_close(scoped_norm(flat, None, None, None), flat)  # nothing to normalize: unchanged
    # no group ids = one group, the batch: the two scopes are the same statistics
    s = _t(1, 3, 5, 7)
    batch = scoped_norm(s, None, "batch", "batch")
    torch.testing.assert_close(scoped_norm(s, None, "group", "batch"), batch)
    torch.testing.assert_close(batch, (s - 4) / (math.sqrt(20 / 3) + E))


def test_a_bad_scope_is_refused():
    with pytest.raises(ValueError, match="std scope 'running'"):
        scoped_norm(SCORES, GROUPS, "batch", "running")


@pytest.mark.parametrize(
    "method, whole_batch, expected",
    [
        ("identity", False, (None, None)),
        ("mean", False, ("group", None)),
        ("mean", True, ("batch", None)),
        ("mean_std", False, ("group", "group")),
        ("mean_std", True, ("batch", "batch")),
        ("asym_clip", False, ("group", "group")),
    ],
)
def test_method_derives_the_unset_types_as_roll(method, whole_batch, expected):
    assert resolve_norm_types(method, None, None, whole_batch) == expected


def test_set_types_win_and_each_unset_one_is_derived():
    assert resolve_norm_types("mean_std", "group", "batch", False) == ("group", "batch")
    assert resolve_norm_types("mean_std", None, "batch", False) == ("group", "batch")
    assert resolve_norm_types("mean", "batch", None, False) == ("batch", None)
    assert resolve_norm_types("identity", None, "group", False) == (None, "group")


def test_episode_norm_of_the_methods_is_their_function_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    scores, ids = torch.rand(40, generator=g), torch.randint(0, 7, (40,), generator=g)
    for method in ("identity", "mean", "mean_std", "asym_clip"):
        for group_ids in (ids, None):
            assert torch.equal(
                normalize_episode_scores(scores, group_ids, method), normalize_scores(scores, group_ids, method)
            )


def test_asym_clip_keeps_its_clamp_with_set_types():
    # groups {0, 0, 0, 1} x 2: group mean 1/4; batch sample std sqrt(1.5 / 7); the 1s: 0.75 / 0.463 = 1.62
    s = _t(0, 0, 0, 1, 0, 0, 0, 1)
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    sd = math.sqrt(1.5 / 7)
    unclamped = scoped_norm(s, ids, "group", "batch")
    torch.testing.assert_close(unclamped[3], torch.tensor(0.75 / (sd + E)))
    out = normalize_episode_scores(s, ids, "asym_clip", "group", "batch")
    torch.testing.assert_close(out, unclamped.clamp(-1.0, 3.0))
    assert float(out.max()) == pytest.approx(0.75 / (sd + E)) and float(out.min()) == pytest.approx(-0.25 / (sd + E))
    # a score 4 std above the mean is clamped to 3
    big = normalize_episode_scores(
        _t(*([0.0] * 15), 1, 0, 1), torch.tensor([0] * 16 + [1, 1]), "asym_clip", "group", "group"
    )
    assert float(big[15]) == 3.0


def test_a_users_method_runs_its_own_formula_and_refuses_norm_types():
    @register_score_norm("times_two_test")
    def times_two(scores, group_ids):
        return scores * 2

    try:
        torch.testing.assert_close(normalize_episode_scores(SCORES, GROUPS, "times_two_test"), SCORES * 2)
        assert resolve_norm_types("times_two_test", None, None, False) is None
        with pytest.raises(ValueError, match="times_two_test.*formula of its own.*norm_std_type='batch'"):
            normalize_episode_scores(SCORES, GROUPS, "times_two_test", None, "batch")
    finally:
        SCORE_NORMS.unregister("times_two_test")


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
