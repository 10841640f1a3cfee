"""Advantage estimators: hand-computed multi-span cases and plain-loop references on random inputs."""

import pytest
import torch

from roll.algorithms.advantages import (
    AdvantageInputs,
    compute_advantage,
    discounted_turn_returns,
    get_advantage_fn,
    step_level_advantages,
    whiten_and_clip_advantages,
)

NAN = float("nan")
# One multi-turn row: position 0 prompt, turn 1 = tokens 1-2, observation 3-4, turn 2 = tokens 5-6.
MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1]])
# turn reward 0.5 on token 2, episode reward 1.0 on token 6; junk at unmasked positions must be ignored
REWARDS = torch.tensor([[9.0, 0.0, 0.5, 100.0, NAN, 0.0, 1.0]])
VALUES = torch.tensor([[NAN, 0.2, 0.4, 7.0, NAN, 0.6, 0.8]])


def test_reinforce_multi_span_discounted():
    out = compute_advantage("reinforce", AdvantageInputs(REWARDS, MASK, gamma=0.5))
    # masked steps 1,2,5,6 with rewards 0, .5, 0, 1: G6=1, G5=.5, G2=.5+.25=.75, G1=.375
    expected = torch.tensor([[0.0, 0.375, 0.75, 0.0, 0.0, 0.5, 1.0]])
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected)


def test_reinforce_multi_span_undiscounted():
    out = compute_advantage("reinforce", AdvantageInputs(REWARDS, MASK, gamma=1.0))
    torch.testing.assert_close(out.returns, torch.tensor([[0.0, 1.5, 1.5, 0.0, 0.0, 1.0, 1.0]]))


def test_gae_multi_span():
    out = compute_advantage("gae", AdvantageInputs(REWARDS, MASK, values=VALUES, gamma=0.5, lambd=0.5))
    # d6 = 1 - .8 = .2, A6 = .2
    # d5 = .5*.8 - .6 = -.2, A5 = -.2 + .25*.2 = -.15
    # d2 = .5 + .5*.6 - .4 = .4, A2 = .4 + .25*(-.15) = .3625
    # d1 = .5*.4 - .2 = 0, A1 = .25*.3625 = .090625
    adv = torch.tensor([[0.0, 0.090625, 0.3625, 0.0, 0.0, -0.15, 0.2]])
    torch.testing.assert_close(out.advantages, adv)
    torch.testing.assert_close(out.returns, torch.tensor([[0.0, 0.290625, 0.7625, 0.0, 0.0, 0.45, 1.0]]))


def test_gae_without_values_is_explained():
    with pytest.raises(ValueError, match="needs critic values"):
        compute_advantage("gae", AdvantageInputs(REWARDS, MASK))


def _outcome_batch(rewards):
    """Rows of T=3, all masked, reward on the last token."""
    r = torch.zeros(len(rewards), 3)
    r[:, -1] = torch.tensor(rewards)
    return r, torch.ones(len(rewards), 3)


def test_grpo_hand():
    r, m = _outcome_batch([1.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 0, 1, 1, 2])
    out = compute_advantage("grpo", AdvantageInputs(r, m, group_ids=g))
    # group {1,0,0}: mean 1/3, sample std sqrt(1/3); constant group and singleton -> 0
    std = (1 / 3) ** 0.5 + 1e-6
    expected = torch.tensor([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std, 0.0, 0.0, 0.0])
    torch.testing.assert_close(out.advantages, expected[:, None].expand(6, 3))
    torch.testing.assert_close(out.returns, out.advantages)


def test_rloo_hand():
    r, m = _outcome_batch([1.0, 0.0, 0.0, 2.0, 4.0, 5.0])
    g = torch.tensor([0, 0, 0, 1, 1, 2])
    out = compute_advantage("rloo", AdvantageInputs(r, m, group_ids=g))
    # 1 - mean(0,0) = 1; 0 - mean(1,0) = -.5; 2 - 4 = -2; 4 - 2 = 2; singleton 0
    expected = torch.tensor([1.0, -0.5, -0.5, -2.0, 2.0, 0.0])
    torch.testing.assert_close(out.advantages, expected[:, None].expand(6, 3))


def test_reinforce_plus_plus_hand():
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    out = compute_advantage("reinforce_plus_plus", AdvantageInputs(r, torch.ones(2, 2)))
    # G = [[1,1],[0,0]]: mean .5, unbiased var 1/3 -> +-.5 / sqrt(1/3)
    a = 0.5 / (1 / 3) ** 0.5
    torch.testing.assert_close(out.advantages, torch.tensor([[a, a], [-a, -a]]), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_unknown_estimator_lists_names():
    with pytest.raises(KeyError, match="dr_grpo.*gae.*grpo.*reinforce.*reinforce_plus_plus.*rloo"):
        get_advantage_fn("ppo")


def test_input_validation():
    with pytest.raises(ValueError, match="values"):
        AdvantageInputs(REWARDS, MASK, values=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="gamma"):
        AdvantageInputs(REWARDS, MASK, gamma=1.5)
    with pytest.raises(ValueError, match="group_ids"):
        AdvantageInputs(REWARDS, MASK, group_ids=torch.tensor([0, 1]))


# ---- plain-loop references on random inputs ----


def _random_batch(seed, b=12, t=9):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, generator=gen) > 0.35).long()
    mask[0] = 0  # a row with no response tokens
    rewards = torch.randn(b, t, generator=gen)
    values = torch.randn(b, t, generator=gen)
    groups = torch.randint(0, 4, (b,), generator=gen)
    return rewards, mask, values, groups


def _loop_gae(rewards, values, mask, gamma, lambd):
    out = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        steps = [t for t in range(rewards.shape[1]) if mask[i, t]]
        adv, next_v = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[i, t].item() + gamma * next_v - values[i, t].item()
            adv = delta + gamma * lambd * adv
            out[i, t], next_v = adv, values[i, t].item()
    return out


def _loop_episode_rewards(rewards, mask):
    return [sum(rewards[i, t].item() for t in range(rewards.shape[1]) if mask[i, t]) for i in range(len(rewards))]


def _loop_grpo(rewards, mask, groups, eps):
    r = _loop_episode_rewards(rewards, mask)
    out = []
    for i in range(len(r)):
        members = [r[j] for j in range(len(r)) if groups[j] == groups[i]]
        n = len(members)
        mean = sum(members) / n
        std = (sum((x - mean) ** 2 for x in members) / (n - 1)) ** 0.5 if n > 1 else 0.0
        out.append(0.0 if std < 1e-6 else (r[i] - mean) / (std + eps))
    return torch.tensor(out)[:, None] * mask


def _loop_rloo(rewards, mask, groups):
    r = _loop_episode_rewards(rewards, mask)
    out = []
    for i in range(len(r)):
        others = [r[j] for j in range(len(r)) if groups[j] == groups[i] and j != i]
        out.append(r[i] - sum(others) / len(others) if others else 0.0)
    return torch.tensor(out)[:, None] * mask


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_loop(seed):
    rewards, mask, values, _ = _random_batch(seed)
    out = compute_advantage("gae", AdvantageInputs(rewards, mask, values=values, gamma=0.9, lambd=0.8))
    torch.testing.assert_close(out.advantages, _loop_gae(rewards, values, mask, 0.9, 0.8))
    # lambda = 1: GAE advantages + values = discounted returns
    out1 = compute_advantage("gae", AdvantageInputs(rewards, mask, values=values, gamma=0.9, lambd=1.0))
    ref = compute_advantage("reinforce", AdvantageInputs(rewards, mask, gamma=0.9))
    torch.testing.assert_close(out1.returns, ref.returns)


@pytest.mark.parametrize("seed", range(5))
def test_grpo_and_rloo_match_loops(seed):
    rewards, mask, _, groups = _random_batch(seed)
    grpo = compute_advantage("grpo", AdvantageInputs(rewards, mask, group_ids=groups))
    torch.testing.assert_close(grpo.advantages, _loop_grpo(rewards, mask, groups, 1e-6))
    rloo = compute_advantage("rloo", AdvantageInputs(rewards, mask, group_ids=groups))
    torch.testing.assert_close(rloo.advantages, _loop_rloo(rewards, mask, groups))


@pytest.mark.parametrize("gamma", [1.0, 0.97])
def test_discounted_returns_match_gae_loop_with_zero_values(gamma):
    # with V = 0 and lambda = 1, GAE equals the discounted return (covers the gamma = 1 cumsum fast path)
    rewards, mask, _, _ = _random_batch(11)
    out = compute_advantage("reinforce", AdvantageInputs(rewards, mask, gamma=gamma))
    torch.testing.assert_close(out.returns, _loop_gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0))


def test_step_level_advantages():
    returns = torch.tensor([1.0, 0.0, 3.0, 2.0, 4.0])
    groups = torch.tensor([0, 0, 0, 0, 1])
    states = torch.tensor([7, 7, 8, 7, 7])  # anchor (0,7) = rows 0,1,3; (0,8) and (1,7) are singletons
    episode = torch.full((5,), 0.1)
    out = step_level_advantages(returns, groups, states, episode, episode_weight=1.0, step_weight=0.5)
    # anchor (0,7): returns {1,0,2}, mean 1, sample std 1 -> step adv 0, -1, +1 (divided by 1 + 1e-6)
    d = 0.5 / (1 + 1e-6)
    torch.testing.assert_close(out, torch.tensor([0.1, 0.1 - d, 0.1, 0.1 + d, 0.1]))
    only_step = step_level_advantages(returns, groups, states, episode, episode_weight=0.0, method="mean")
    torch.testing.assert_close(only_step, torch.tensor([0.0, -1.0, 0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="turn_state_ids"):
        step_level_advantages(returns, groups, states[:2], episode)


def test_whiten_and_clip_advantages():
    adv = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # masked {1,3,5}: mean 3, unbiased std 2 -> -1, 0, 1
    torch.testing.assert_close(whiten_and_clip_advantages(adv, mask, True, None), torch.tensor([[-1.0, 0], [1, 0]]))
    torch.testing.assert_close(whiten_and_clip_advantages(adv, mask, True, 0.5), torch.tensor([[-0.5, 0], [0.5, 0]]))
    torch.testing.assert_close(whiten_and_clip_advantages(adv, mask, False, 2.0), torch.tensor([[1.0, 2], [2, 0]]))
    with pytest.raises(ValueError, match="advantage_clip"):
        whiten_and_clip_advantages(adv, mask, False, -1.0)


def test_dr_grpo_hand():
    r, m = _outcome_batch([1.0, 0.0, 0.0, 2.0, 4.0, 5.0])
    g = torch.tensor([0, 0, 0, 1, 1, 2])
    out = compute_advantage("dr_grpo", AdvantageInputs(r, m, group_ids=g))
    # R - group mean: {1,0,0} mean 1/3; {2,4} mean 3; singleton 0
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3, -1.0, 1.0, 0.0])
    torch.testing.assert_close(out.advantages, expected[:, None].expand(6, 3))


def test_discounted_turn_returns():
    # episodes 0 and 1 interleaved; episode 0 rewards [0, 1, 2], episode 1 rewards [5]
    rewards = torch.tensor([0.0, 5.0, 1.0, 2.0])
    episodes = torch.tensor([0, 1, 0, 0])
    # episode 0 with gamma .5: G2 = 2, G1 = 1 + 1 = 2, G0 = 0 + 1 = 1
    torch.testing.assert_close(discounted_turn_returns(rewards, episodes, 0.5), torch.tensor([1.0, 5.0, 2.0, 2.0]))
    with pytest.raises(ValueError, match="gamma"):
        discounted_turn_returns(rewards, episodes, 2.0)


def test_step_reinforce_hand_computed():
    """ROLL's step_reinforce: per-turn discounted returns normalized among the turns of one group.

    Group 0: sample 0 has turns with rewards 0 and 1 (gamma 0.5: returns 0.5, 1), sample 1 one turn of reward 2;
    group mean 7/6, so with ``mean`` the advantages are -2/3, -1/6, 5/6. Sample 2 is alone in group 1: 0.
    """
    from roll.algorithms.advantages import AdvantageInputs, TurnInputs, compute_advantage

    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    turns = TurnInputs(
        sample=torch.tensor([0, 0, 1, 2]),
        start=torch.tensor([0, 2, 0, 0]),
        end=torch.tensor([2, 4, 3, 2]),
        rewards=torch.tensor([0.0, 1.0, 2.0, 5.0]),
        state_ids=torch.tensor([7, 8, 7, 9]),
    )
    inputs = AdvantageInputs(
        token_level_rewards=torch.zeros(3, 5),
        response_mask=mask,
        group_ids=torch.tensor([0, 0, 1]),
        gamma=0.5,
        turns=turns,
    )
    adv = compute_advantage("step_reinforce", inputs, step_adv_norm="mean").advantages
    expected = torch.tensor([[-2 / 3, -2 / 3, -1 / 6, -1 / 6, 0], [5 / 6, 5 / 6, 5 / 6, 0, 0], [0, 0, 0, 0, 0]])
    torch.testing.assert_close(adv, expected)
    std = (7 / 12) ** 0.5  # mean_std (the default): sample std of (0.5, 1, 2) = sqrt(7/12)
    adv = compute_advantage("step_reinforce", inputs).advantages
    torch.testing.assert_close(adv[0, 0], torch.tensor(-2 / 3 / (std + 1e-6)))


def test_gigpo_episode_norm_mean_hand_computed():
    """GiGPO's F_norm = 1 at the episode level (``episode_adv_norm="mean"``): R_i - mean_g, no std.

    Group 0: episode rewards 1, 0, 0 (mean 1/3): episode terms 2/3, -1/3, -1/3 (with mean_std: divided by the
    sample std 0.57735, i.e. 1.1547, -0.57735, -0.57735). Sample 3 is alone in group 1: 0. One turn per sample,
    each in its own state, so the step term is 0 and the advantage is the episode term alone.
    """
    from roll.algorithms.advantages import TurnInputs

    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1]], dtype=torch.float32)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 3.0]])
    turns = TurnInputs(
        sample=torch.tensor([0, 1, 2, 3]),
        start=torch.zeros(4, dtype=torch.long),
        end=torch.full((4,), 2, dtype=torch.long),
        rewards=torch.tensor([1.0, 0.0, 0.0, 3.0]),
        state_ids=torch.tensor([0, 1, 2, 3]),
    )
    inputs = AdvantageInputs(rewards, mask, group_ids=torch.tensor([0, 0, 0, 1]), turns=turns)
    adv = compute_advantage("gigpo", inputs, episode_adv_norm="mean").advantages
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0]))
    std = (1 / 3) ** 0.5  # the default, mean_std: GRPO's episode term
    adv = compute_advantage("gigpo", inputs).advantages
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0]) / (std + 1e-6))
    with pytest.raises(ValueError, match="episode_adv_norm must be one of"):
        compute_advantage("gigpo", inputs, episode_adv_norm="std")
    with pytest.raises(ValueError, match="step_adv_norm must be one of"):
        compute_advantage("step_reinforce", inputs, step_adv_norm="median")


def test_estimator_hyperparameters_are_its_keyword_parameters():
    from roll.algorithms.advantages import estimator_parameters

    assert estimator_parameters("gigpo") == {
        "episode_adv_weight": 1.0,
        "step_adv_weight": 1.0,
        "step_adv_norm": "mean_std",
        "episode_adv_norm": "mean_std",
    }
    assert estimator_parameters("step_reinforce") == {"step_adv_norm": "mean_std"}
    assert estimator_parameters("grpo") == {}
