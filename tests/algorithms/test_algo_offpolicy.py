"""Train/inference (off-policy) correction: importance weights and band filters at every granularity, against
hand-computed values."""

import math

import pytest
import torch

from roll.algorithms.offpolicy import aggregate, importance_weights, prob_diff_band_mask, ratio_band_mask

# row 0: two turns (spans 0-1 and 3-4), an observation at 2 whose junk must be ignored; row 1: one span of 3
MASK = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.float32)
D = torch.tensor([[0.2, 0.4, 9.0, -0.6, 0.2], [0.1, 0.1, 0.4, 7.0, 7.0]])  # proximal - behaviour
BEHAVIOUR = torch.full((2, 5), -1.0)
PROXIMAL = BEHAVIOUR + D


def test_aggregate_hand_computed():
    torch.testing.assert_close(aggregate(D, MASK, "token"), D * MASK)
    # spans: (0.2 + 0.4) / 2 = 0.3, (-0.6 + 0.2) / 2 = -0.2; row 1: 0.6 / 3 = 0.2
    torch.testing.assert_close(
        aggregate(D, MASK, "segment"), torch.tensor([[0.3, 0.3, 0, -0.2, -0.2], [0.2, 0.2, 0.2, 0, 0]])
    )
    # per sample: mean 0.2 / 4 = 0.05 and 0.2; sum 0.2 and 0.6
    torch.testing.assert_close(
        aggregate(D, MASK, "geometric"), torch.tensor([[0.05, 0.05, 0, 0.05, 0.05], [0.2, 0.2, 0.2, 0, 0]])
    )
    torch.testing.assert_close(
        aggregate(D, MASK, "sequence"), torch.tensor([[0.2, 0.2, 0, 0.2, 0.2], [0.6, 0.6, 0.6, 0, 0]])
    )
    with pytest.raises(ValueError, match="token"):
        aggregate(D, MASK, "turn")


def test_importance_weights_truncated_and_one_off_the_mask():
    w, m = importance_weights(PROXIMAL, BEHAVIOUR, MASK, "token", upper_bound=1.3)
    e = math.exp
    want = torch.tensor([[e(0.2), 1.3, 1.0, e(-0.6), e(0.2)], [e(0.1), e(0.1), 1.3, 1.0, 1.0]])
    torch.testing.assert_close(w, want)
    assert m["actor/is_weight_truncated_frac"] == pytest.approx(2 / 7)  # exp(0.4) twice above 1.3
    raw = [e(0.2), e(0.4), e(-0.6), e(0.2), e(0.1), e(0.1), e(0.4)]
    assert m["actor/is_weight_mean"] == pytest.approx(sum(raw) / 7, rel=1e-6)
    w, _ = importance_weights(PROXIMAL, BEHAVIOUR, MASK, "sequence", upper_bound=None)
    torch.testing.assert_close(w[1], torch.tensor([e(0.6)] * 3 + [1.0, 1.0]))


def test_ratio_band_token_and_segment():
    keep = ratio_band_mask(PROXIMAL, BEHAVIOUR, MASK, "token", 0.8, 1.25)
    # exp: 1.221 in, 1.492 out, (off), 0.549 out, 1.221 in; 1.105, 1.105 in, 1.492 out
    assert keep.tolist() == [[1, 0, 1, 0, 1], [1, 1, 0, 1, 1]]
    keep = ratio_band_mask(PROXIMAL, BEHAVIOUR, MASK, "segment", 0.8, 1.25)
    # spans: exp(0.3) = 1.35 out, exp(-0.2) = 0.819 in; row 1 exp(0.2) = 1.221 in
    assert keep.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]


def test_prob_diff_band():
    proximal = torch.log(torch.tensor([[0.5, 0.9, 0.1, 0.3, 0.3]]))
    behaviour = torch.log(torch.tensor([[0.4, 0.2, 0.9, 0.3, 0.9]]))
    mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.float32)
    # token diffs 0.1, 0.7, (off), 0, -0.6; band [-0.5, 0.5]
    assert prob_diff_band_mask(proximal, behaviour, mask, "token", -0.5, 0.5).tolist() == [[1, 0, 1, 1, 0]]
    # geometric: mean (0.1 + 0.7 + 0 - 0.6) / 4 = 0.05: all in
    assert prob_diff_band_mask(proximal, behaviour, mask, "geometric", -0.5, 0.5).tolist() == [[1] * 5]


def _batch():
    from roll.data.batch import Batch

    # 2 samples of 6 tokens: a 1-token prompt, then responses (log-prob frame: 5 positions)
    response = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]])
    old = torch.tensor([[-1.0, -1.0, -2.0, -1.0, -1.0], [-0.5, -0.5, -0.5, 0.0, 0.0]])
    rollout = old - torch.tensor([[0.0, 0.4, 0.0, -0.6, 0.1], [0.1, 0.0, 0.0, 0.0, 0.0]])  # d = old - rollout
    return Batch(
        {
            "response_mask": response,
            "old_log_probs": old,
            "rollout_log_probs": rollout,
            "rollout_log_prob_mask": torch.ones(2, 5),
            "advantages": torch.tensor([[1.0] * 5, [-2.0] * 5]),
        }
    )


def test_the_pipeline_stores_weights_and_mask_and_the_loss_applies_them():
    """Decoupled PPO: the loss with weights w equals the PPO loss of advantages w * A over the kept tokens, and a
    masked token has no gradient."""
    from roll.algorithms.losses import ActorLossConfig, actor_loss
    from roll.config.base import CorrectionFilterConfig, TrainInferCorrectionConfig
    from roll.ppo.correction import apply_train_infer_correction
    from roll.ppo.loss_fns import PPOActorLoss, loss_mask

    cfg = TrainInferCorrectionConfig()
    cfg.is_weight.enabled, cfg.is_weight.upper_bound = True, 1.3
    cfg.filters = [CorrectionFilterConfig(agg_type="token", ratio_low=0.7, ratio_high=1.4)]
    batch = _batch()
    metrics = apply_train_infer_correction(cfg, batch)
    w, keep = batch["train_infer_is_weight"], batch["train_infer_mask"]
    # d = 0.4 -> 1.49 truncated to 1.3 and outside the band; d = -0.6 -> 0.549 outside the band
    assert keep.tolist() == [[1, 0, 1, 0, 1], [1, 1, 1, 1, 1]]
    assert w[0, 1].item() == pytest.approx(1.3) and w[0, 4].item() == pytest.approx(math.exp(0.1))
    assert metrics["actor/train_infer_masked_frac"] == pytest.approx(2 / 8)
    assert metrics["actor/is_weight_truncated_frac"] == pytest.approx(1 / 8)

    log_probs = (batch["old_log_probs"] + 0.05).requires_grad_()
    loss_fn = PPOActorLoss(ActorLossConfig())
    loss, _ = loss_fn(log_probs, None, batch)
    loss.backward()
    got = log_probs.grad.clone()
    ref_lp = (batch["old_log_probs"] + 0.05).requires_grad_()
    mask = loss_mask(batch) * keep
    ref, _ = actor_loss(ref_lp, batch["old_log_probs"], batch["advantages"] * w, mask, ActorLossConfig())
    ref.backward()
    assert loss.item() == pytest.approx(ref.item())
    torch.testing.assert_close(got, ref_lp.grad)
    assert got[0, 1] == 0 and got[0, 3] == 0 and got[0, 0] != 0  # filtered tokens give no gradient
    assert loss_fn.normalizer(batch) == 6  # the kept tokens: token-mean over them


def test_correction_turns_off_the_skipped_old_log_prob_pass():
    from roll.config.agentic import AgenticConfig
    from roll.ppo.epochs import actor_mini_batch, skip_old_log_probs

    cfg = AgenticConfig()
    n = actor_mini_batch(cfg)
    assert skip_old_log_probs(cfg, n, step=1)
    cfg.train_infer_correction.is_weight.enabled = True
    assert not skip_old_log_probs(cfg, n, step=1)
