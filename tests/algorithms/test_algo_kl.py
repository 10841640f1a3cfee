"""KL estimators, the KL reward penalty and the KL coefficient controllers."""

import math

import pytest
import torch

from roll.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    full_kl,
    kl_penalty,
    make_kl_controller,
)

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # d = logp - ref = [0.5, -1.0]


@pytest.mark.parametrize(
    "kind,expected",
    [
        ("kl", [0.5, -1.0]),
        ("k1", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),  # 0.5 * d^2
        # r = ref - logp = [-0.5, 1.0]; exp(r) - r - 1
        ("low_var_kl", [math.exp(-0.5) - 0.5, math.e - 2]),
        ("k3", [math.exp(-0.5) - 0.5, math.e - 2]),
    ],
)
def test_token_kl_types(kind, expected):
    torch.testing.assert_close(kl_penalty(LOGP, REF, kind), torch.tensor([expected]))


def test_low_var_kl_is_clamped():
    # r = -30 -> clamped to -20: exp(-20) + 19 ~ 19 -> 10; r = +30 -> exp(20) - 21 -> 10
    out = kl_penalty(torch.tensor([[0.0, -30.0]]), torch.tensor([[-30.0, 0.0]]), "low_var_kl")
    torch.testing.assert_close(out, torch.tensor([[10.0, 10.0]]))


def test_full_kl():
    # p uniform over 2, q = [0.75, 0.25]: KL = 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.5 ln(4/3)
    logits = torch.zeros(1, 1, 2)
    ref_logits = torch.tensor([[[math.log(3.0), 0.0]]])
    out = full_kl(logits, ref_logits)
    assert out.shape == (1, 1)
    assert out.item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    torch.testing.assert_close(kl_penalty(logits, ref_logits, "full"), out)
    assert full_kl(ref_logits, ref_logits).item() == pytest.approx(0.0, abs=1e-7)


def test_unknown_kind_lists_names():
    with pytest.raises(KeyError, match="abs.*full.*k1.*k2.*k3.*kl.*low_var_kl.*mse"):
        kl_penalty(LOGP, REF, "k4")


def test_apply_kl_penalty():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    logp = torch.tensor([[0.1, 0.2, 0.3], [0.4, -0.2, 9.0]])
    ref = torch.zeros(2, 3)
    rewards, metrics = apply_kl_penalty(scores, logp, ref, mask, kl_coef=0.5, kind="kl")
    # r = s - 0.5 * kl on masked tokens; the padded 9.0 is ignored
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 2.1, 0.0]]))
    # per-sequence mean kl: 0.2 and 0.1 -> 0.15
    assert metrics["actor/reward_kl"] == pytest.approx(0.15)
    assert metrics["actor/reward_kl_coef"] == 0.5


def test_adaptive_controller_follows_ziegler():
    ctl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctl.update(current_kl=0.15, n_steps=10)  # error 0.5 clipped to 0.2: * (1 + 0.2 * 10 / 100)
    assert ctl.value == pytest.approx(0.204)
    ctl.update(current_kl=0.09, n_steps=10)  # error -0.1: * (1 - 0.1 * 0.1)
    assert ctl.value == pytest.approx(0.204 * 0.99)
    before = ctl.value
    ctl.update(current_kl=0.1, n_steps=10)  # on target: unchanged
    assert ctl.value == pytest.approx(before)
    restored = AdaptiveKLController(1.0, 1.0, 1)
    restored.load_state_dict(ctl.state_dict())
    assert (restored.value, restored.target_kl, restored.horizon) == (ctl.value, 0.1, 100)


def test_fixed_controller_and_factory():
    ctl = make_kl_controller(0.2, None, 100)
    assert isinstance(ctl, FixedKLController)
    ctl.update(5.0, 10)
    assert ctl.value == 0.2
    assert isinstance(make_kl_controller(0.2, 0.05, 100), AdaptiveKLController)
    other = FixedKLController(0.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.2


def test_controller_argument_errors():
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.1, 0)
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(-1.0)
