"""Loss aggregation, policy/value losses, entropy and the actor loss composition against hand-computed values."""

import math

import pytest
import torch

from roll.algorithms.aggregation import agg_loss
from roll.algorithms.losses import (
    ActorLossConfig,
    actor_loss,
    entropy_from_logits,
    explained_variance,
    gspo_policy_loss,
    ppo_policy_loss,
    value_loss,
)

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
LMASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    "mode,norm_len,expected",
    [
        ("token-mean", None, 7 / 3),  # (1 + 2 + 4) / 3
        ("seq-mean-token-sum", None, 3.5),  # (3 + 4) / 2
        ("seq-mean-token-mean", None, 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", None, 7 / 6),  # (3/3 + 4/3) / 2, L = T = 3
        ("seq-mean-token-sum-norm", 2, 1.75),  # (3/2 + 4/2) / 2
    ],
)
def test_agg_loss_modes(mode, norm_len, expected):
    assert agg_loss(LOSS, LMASK, mode, norm_len).item() == pytest.approx(expected)
    # a padding row (mask all 0) does not count in any mode
    padded = agg_loss(
        torch.cat([LOSS, torch.full((1, 3), 9.0)]), torch.cat([LMASK, torch.zeros(1, 3).long()]), mode, norm_len
    )
    assert padded.item() == pytest.approx(expected)


def test_agg_loss_empty_mask_and_errors():
    assert agg_loss(LOSS, torch.zeros_like(LMASK), "seq-mean-token-mean").item() == 0.0
    with pytest.raises(KeyError, match="seq-mean-token-sum-norm.*token-mean"):
        agg_loss(LOSS, LMASK, "sum")
    with pytest.raises(ValueError, match="norm_len"):
        agg_loss(LOSS, LMASK, "seq-mean-token-sum-norm", 0)


# Four tokens, clip 0.2:
#  t0 A=+1 r=1.5: max(-1.5, -1.2) = -1.2 (clipped)    t1 A=+1 r=0.5: max(-0.5, -0.8) = -0.5
#  t2 A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped)       t3 A=-1 r=5.0: max(5, 1.2) = 5 (dual clip c=3 -> 3)
RATIO = torch.tensor([[1.5, 0.5, 0.5, 5.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
OLD = torch.zeros(1, 4)
MASK4 = torch.ones(1, 4)


def _logp():
    return RATIO.log().clone().requires_grad_(True)


def test_ppo_loss_hand():
    logp = _logp()
    loss, m = ppo_policy_loss(logp, OLD, ADV, MASK4)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 5.0) / 4)
    assert m["actor/pg_loss"] == pytest.approx(loss.item())
    assert m["actor/clip_frac"] == pytest.approx(0.5)
    assert m["actor/dual_clip_frac"] == 0.0
    # k3 of KL(old || new): mean of r - 1 - ln r
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 0.5, 5.0)) / 4
    assert m["actor/approx_kl"] == pytest.approx(k3, rel=1e-5)
    loss.backward()
    # only unclipped tokens carry gradient: d(-A r)/d logp = -A r, / 4 tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.125, 0.0, 1.25]]))


def test_ppo_dual_clip_and_clip_higher():
    loss, m = ppo_policy_loss(_logp(), OLD, ADV, MASK4, dual_clip=3.0)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0) / 4)
    assert m["actor/dual_clip_frac"] == pytest.approx(0.25)
    loss, _ = ppo_policy_loss(_logp(), OLD, ADV, MASK4, clip_high=0.28)  # t0 clipped at 1.28
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 5.0) / 4)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_policy_loss(_logp(), OLD, ADV, MASK4, dual_clip=0.5)


def test_ppo_mask_excludes_tokens():
    loss, m = ppo_policy_loss(_logp(), OLD, ADV, torch.tensor([[1, 1, 0, 0]]))
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert m["actor/clip_frac"] == pytest.approx(0.5)


def test_gspo_uses_sequence_ratio():
    logp = torch.tensor([[0.1, 0.3]], requires_grad=True)
    adv = torch.ones(1, 2)
    s = math.exp(0.2)  # exp(mean log-ratio)
    loss, m = gspo_policy_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2), clip_low=0.5, clip_high=0.5)
    assert loss.item() == pytest.approx(-s, rel=1e-5)
    loss.backward()
    # value s per token, gradient of log pi_t: d/dlogp_t of mean_t(-s_t) = -s / 2
    torch.testing.assert_close(logp.grad, torch.full((1, 2), -s / 2))
    loss, m = gspo_policy_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2))  # default 4e-4 clip-high
    assert loss.item() == pytest.approx(-1.0004, rel=1e-6)
    assert m["actor/clip_frac"] == 1.0


def test_entropy_from_logits():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e4, -1e4]]])
    # uniform over 4: ln 4; p = [.75, .25]: -(.75 ln .75 + .25 ln .25)
    expected = torch.tensor([[math.log(4.0), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]])
    torch.testing.assert_close(entropy_from_logits(logits), expected)


def test_value_loss_hand():
    values = torch.tensor([[0.5, 2.0]], requires_grad=True)
    old, returns, mask = torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    # t0: (0.5-1)^2 = .25 vs clipped V 0.2: .64 -> .64 (clipped); t1: 1 vs .64 -> 1
    loss, m = value_loss(values, old, returns, mask, value_clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert m["critic/vf_clip_frac"] == pytest.approx(0.5)
    assert m["critic/vpred_mean"] == pytest.approx(1.25)
    loss, m = value_loss(values, old, returns, mask, value_clip=None)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 1.0) / 2)
    assert m["critic/vf_clip_frac"] == 0.0


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4), returns, mask).item() == pytest.approx(0.0)
    # R - V = [1,0,0,0]: var 0.25; var R = 5/3 -> 1 - 0.15
    values = torch.tensor([[0.0, 2.0, 3.0, 4.0]])
    assert explained_variance(values, returns, mask).item() == pytest.approx(0.85)
    assert math.isnan(explained_variance(values, torch.ones(1, 4), mask).item())


def test_actor_loss_composition():
    cfg = ActorLossConfig(entropy_loss_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="kl")
    logp = _logp()
    ref = logp.detach() - 0.2  # k1 = 0.2 on every token
    loss, m = actor_loss(logp, OLD, ADV, MASK4, cfg, entropy=torch.ones(1, 4), ref_log_probs=ref)
    # pg 1.025 + 0.1 * 0.2 - 0.01 * 1.0
    assert loss.item() == pytest.approx(1.025 + 0.02 - 0.01)
    assert m["actor/loss"] == pytest.approx(loss.item())
    assert m["actor/kl_loss"] == pytest.approx(0.2)
    assert m["actor/ref_kl"] == pytest.approx(0.2)
    assert m["actor/entropy"] == pytest.approx(1.0)
    assert m["actor/clip_frac"] == pytest.approx(0.5)


def test_actor_loss_config_maps_clip_settings():
    cfg = ActorLossConfig(pg_clip=0.2, pg_clip_high=0.28, dual_clip_loss=True, dual_clip_c=3.0)
    assert (cfg.clip_low, cfg.clip_high) == (0.2, 0.28)
    loss, m = actor_loss(_logp(), OLD, ADV, MASK4, cfg)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0) / 4)
    assert "actor/ref_kl" not in m and "actor/entropy" not in m


def test_actor_loss_errors():
    with pytest.raises(ValueError, match="ref_log_probs"):
        actor_loss(_logp(), OLD, ADV, MASK4, ActorLossConfig(use_kl_loss=True, kl_loss_coef=0.1))
    with pytest.raises(ValueError, match="entropy="):
        actor_loss(_logp(), OLD, ADV, MASK4, ActorLossConfig(entropy_loss_coef=0.01))
    with pytest.raises(ValueError, match="dual_clip_c"):
        ActorLossConfig(dual_clip_loss=True, dual_clip_c=1.0)
    with pytest.raises(KeyError, match="token-mean"):
        ActorLossConfig(loss_agg_mode="mean")
    with pytest.raises(ValueError, match="needs logits"):
        ActorLossConfig(kl_loss_type="full")
    with pytest.raises(ValueError, match="pg_clip"):
        ActorLossConfig(pg_clip_low=1.5)
    with pytest.raises(KeyError, match="gspo.*ppo"):
        ActorLossConfig(policy_loss="trpo")


def test_entropy_keeps_float64():
    """float64 logits get a float64 entropy (a float32 computation is ~1e-6 off at this scale)."""
    logits = torch.randn(4, 8, 1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 5
    p = torch.softmax(logits, dim=-1)
    expected = -(p * torch.log_softmax(logits, dim=-1)).sum(-1)
    out = entropy_from_logits(logits)
    assert out.dtype == torch.float64
    assert (out - expected).abs().max().item() < 1e-10


def test_vf_clip_frac_counts_only_tokens_the_clamp_changed():
    """Inside the clip range, ``old + (v - old)`` can round one ulp away from ``v`` and look 'larger': such tokens
    are not clipped. The tokens are chosen so that the rebuilt value is farther from the return (the metric that
    compared the rebuilt value counted them all)."""
    gen = torch.Generator().manual_seed(0)
    old = (torch.rand(20000, generator=gen) - 0.5) * 0.2
    values = (torch.rand(20000, generator=gen) - 0.5) * 0.2  # |v - old| < 0.2 = value_clip
    rebuilt = old + (values - old)
    returns = values + torch.where(rebuilt > values, -1e-3, 1e-3)  # the rebuilt value is farther from the return
    looks_clipped = (rebuilt != values) & ((rebuilt - returns).square() > (values - returns).square())
    assert looks_clipped.sum() > 100  # what the old metric counted: the case exists at this scale
    v, o, r = values[looks_clipped][None], old[looks_clipped][None], returns[looks_clipped][None]
    _, m = value_loss(v, o, r, torch.ones_like(v), value_clip=0.2)
    assert m["critic/vf_clip_frac"] == 0.0
    # a token outside the range is still counted: v - old = 0.5 clamped to 0.2, clipped branch larger
    _, m = value_loss(
        torch.tensor([[0.5, 0.1]]), torch.zeros(1, 2), torch.tensor([[1.0, 0.1]]), torch.ones(1, 2), value_clip=0.2
    )
    assert m["critic/vf_clip_frac"] == 0.5
