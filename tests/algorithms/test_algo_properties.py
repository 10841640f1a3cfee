"""Property tests (hypothesis): group sums, mask invariance, padding invariance, controller direction."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from roll.algorithms.advantages import ADVANTAGES, AdvantageInputs, compute_advantage
from roll.algorithms.aggregation import AGG_MODES, agg_loss
from roll.algorithms.kl import AdaptiveKLController
from roll.algorithms.policy_losses import ppo_policy_loss
from roll.algorithms.reward_norm import normalize_scores

SETTINGS = settings(max_examples=40, deadline=None)
finite = st.floats(-10, 10, allow_nan=False, width=32)


@st.composite
def token_batches(draw, max_b=6, max_t=7):
    """(rewards, mask, values, group_ids) with B, T >= 1 and group ids in 0..2."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    rewards = torch.tensor(draw(st.lists(finite, min_size=b * t, max_size=b * t))).view(b, t)
    values = torch.tensor(draw(st.lists(finite, min_size=b * t, max_size=b * t))).view(b, t)
    mask = torch.tensor(draw(st.lists(st.integers(0, 1), min_size=b * t, max_size=b * t))).view(b, t)
    groups = torch.tensor(draw(st.lists(st.integers(0, 2), min_size=b, max_size=b)))
    return rewards, mask, values, groups


@SETTINGS
@given(token_batches())
def test_group_baseline_advantages_sum_to_zero_per_group(batch):
    rewards, mask, _, groups = batch
    # one advantage per sample: give every row one response token so that none is dropped by the mask
    mask = mask.clone()
    mask[:, -1] = 1
    for name in ("grpo", "rloo", "dr_grpo"):
        adv = compute_advantage(name, AdvantageInputs(rewards, mask, group_ids=groups)).advantages[:, -1]
        for g in groups.unique():
            members = adv[groups == g]
            assert abs(members.sum().item()) <= 1e-3 * max(1.0, members.abs().max().item())


@SETTINGS
@given(
    token_batches(),
    st.sampled_from([n for n in ADVANTAGES.names() if not ADVANTAGES.capabilities(n)["needs_turns"]]),
    st.floats(0.5, 1.0),
    st.floats(0.0, 1.0),
)
def test_values_at_unmasked_positions_do_not_matter(batch, name, gamma, lambd):
    rewards, mask, values, groups = batch
    junk = torch.where(mask.bool(), torch.zeros_like(rewards), torch.full_like(rewards, float("nan")))
    clean = compute_advantage(name, AdvantageInputs(rewards, mask, values, groups, gamma=gamma, lambd=lambd))
    noisy = compute_advantage(name, AdvantageInputs(rewards + junk, mask, values + junk, groups, gamma, lambd))
    torch.testing.assert_close(noisy.advantages, clean.advantages)
    torch.testing.assert_close(noisy.returns, clean.returns)
    assert (clean.advantages[mask == 0] == 0).all()


@SETTINGS
@given(st.lists(finite, min_size=1, max_size=12), st.integers(1, 4))
def test_identity_normalization_is_identity(scores, n_groups):
    s = torch.tensor(scores)
    g = torch.arange(len(scores)) % n_groups
    torch.testing.assert_close(normalize_scores(s, g, "identity"), s)


@SETTINGS
@given(token_batches(), st.integers(1, 5), st.sampled_from(sorted(set(AGG_MODES.names()))))
def test_losses_invariant_to_extra_padding_columns(batch, extra, mode):
    loss_mat, mask, _, _ = batch
    b, t = loss_mat.shape
    norm_len = t  # a fixed length, so that seq-mean-token-sum-norm does not follow the padded width
    padded_loss = torch.cat([loss_mat, torch.full((b, extra), 1e6)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(b, extra, dtype=mask.dtype)], dim=1)
    torch.testing.assert_close(
        agg_loss(padded_loss, padded_mask, mode, norm_len), agg_loss(loss_mat, mask, mode, norm_len)
    )


@SETTINGS
@given(token_batches(), st.integers(1, 5))
def test_ppo_loss_invariant_to_extra_padding_columns(batch, extra):
    logp, mask, adv, _ = batch
    logp = -logp.abs()
    b = logp.shape[0]
    old = logp + 0.1

    def pad(x, value):
        return torch.cat([x, torch.full((b, extra), value, dtype=x.dtype)], dim=1)

    base, _ = ppo_policy_loss(logp, old, adv, mask, dual_clip=3.0)
    padded, _ = ppo_policy_loss(pad(logp, -50.0), pad(old, 0.0), pad(adv, 7.0), pad(mask, 0), dual_clip=3.0)
    torch.testing.assert_close(padded, base)


@SETTINGS
@given(st.floats(0.01, 1.0), st.floats(0.001, 1.0), st.floats(0.0, 5.0), st.integers(1, 512))
def test_adaptive_kl_moves_toward_target(init, target, current, n_steps):
    ctl = AdaptiveKLController(init, target, horizon=1000)
    ctl.update(current, n_steps)
    if current > target * 1.0001:
        assert ctl.value > init
    elif current < target * 0.9999:
        assert ctl.value < init
    # the multiplicative step never exceeds 20% per horizon
    assert abs(ctl.value / init - 1) <= 0.2 * n_steps / 1000 + 1e-12
