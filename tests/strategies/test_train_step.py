"""The shared training step: token-budget micro-batches, packed rows, chunked log-probs, exact accumulation, the
pre-clip gradient norm of every ZeRO stage and the skipped old-log-prob pass, checked against plain torch."""

from __future__ import annotations

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig
from roll.data.batch import Batch
from roll.models.logprobs import pack_layout, token_log_probs
from roll.ppo.loss_fns import SFT_LOSS, PPOActorLoss, loss_mask
from roll.strategies.accumulation import merge_metrics
from roll.strategies.microbatch import accumulation_weights, micro_batches, plan_by_tokens, trim_right

LENGTHS = [11, 4, 9, 6, 12, 3, 8, 5]  # real tokens per sample (right padded to 12)


def _batch(vocab: int = 500, seed: int = 0) -> Batch:
    """Prompt of 2 tokens, then a response; advantages per sample; right padded."""
    gen = torch.Generator().manual_seed(seed)
    n, width = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(3, vocab, (n, width), generator=gen)
    attention = torch.zeros(n, width, dtype=torch.long)
    response = torch.zeros(n, width, dtype=torch.long)
    for i, length in enumerate(LENGTHS):
        attention[i, :length] = 1
        response[i, 2:length] = 1
        ids[i, length:] = 0
    adv = torch.randn(n, 1, generator=gen).expand(n, width - 1).clone()
    return Batch({"input_ids": ids, "attention_mask": attention, "response_mask": response, "advantages": adv})


# ---------------------------------------------------------------- planning (hand-computed)
def test_plan_by_tokens_first_fit_decreasing():
    # packed: bins by real tokens, longest first (12, 11, 9, 8, 6, 5, 4, 3), each into the first bin it fits:
    # 12 | 11 | 9 | 8, then 6 -> 9 (15), 5 -> 11 (16), 4 -> 12 (16), 3 -> 8 (11)
    assert plan_by_tokens(LENGTHS, 16, packed=True) == [[1, 4], [0, 7], [2, 3], [5, 6]]
    # padded: a bin costs samples x its longest: 12 | 11 | 9 | 8 + 6 (2 x 8) | 5 + 4 + 3 (3 x 5)
    assert plan_by_tokens(LENGTHS, 16, packed=False) == [[4], [0], [2], [3, 6], [1, 5, 7]]
    assert plan_by_tokens([30, 2], 16, packed=True) == [[0], [1]]  # too long: a micro-batch of its own
    with pytest.raises(ValueError, match="max_tokens_per_microbatch"):
        plan_by_tokens([3], 0, packed=True)


def test_micro_batches_trim_padding_in_both_frames():
    batch = _batch()
    batch["old_log_probs"] = torch.arange(8 * 11, dtype=torch.float32).view(8, 11)
    parts = micro_batches(batch, samples=2)
    assert [idx for idx, _ in parts] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    (_, first), (_, third) = parts[0], parts[2]
    assert first["input_ids"].shape == (2, 11) and first["old_log_probs"].shape == (2, 10)
    assert third["input_ids"].shape == (2, 12) and third["old_log_probs"].shape == (2, 11)
    torch.testing.assert_close(first["old_log_probs"], batch["old_log_probs"][:2, :10])
    assert trim_right(third) is third  # nothing to trim


def test_accumulation_weights_make_the_whole_batch_loss():
    batch = _batch()
    parts = [mb for _, mb in micro_batches(batch, samples=3)]
    weights = accumulation_weights(parts, SFT_LOSS.normalizer)
    tokens = [float(loss_mask(p).sum()) for p in parts]  # 9+2+7=18, 4+10+1=15, 6+3=9 response tokens
    assert tokens == [18.0, 15.0, 9.0]
    assert weights == pytest.approx([18 / 42, 15 / 42, 9 / 42])
    assert accumulation_weights(parts, None) == pytest.approx([3 / 8, 3 / 8, 2 / 8])


def test_merge_metrics_weighted_mean_max_min():
    merged = merge_metrics(
        [(0.25, {"a": 4.0, "x_max": 1.0, "y_min": 5.0}), (0.75, {"a": 8.0, "x_max": 3.0, "y_min": 2.0})]
    )
    assert merged == {"a": 7.0, "x_max": 3.0, "y_min": 2.0}


# ---------------------------------------------------------------- log-probs
def _reference_log_probs(model, ids, mask):
    """Full (B, L-1, V) logits in fp32: the plain computation."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    keep = (mask[:, 1:] * mask[:, :-1]).float()
    return lp * keep, ent * keep


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("chunk", [None, 5])
def test_token_log_probs_equal_full_logits(tiny_model_dir, pack, chunk):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = _batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    want_lp, want_ent = _reference_log_probs(model, ids, mask)
    got_lp, got_ent = token_log_probs(model, ids, mask, with_entropy=True, pack=pack, chunk_tokens=chunk)
    torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_ent, want_ent, atol=1e-5, rtol=1e-5)
    # gradients through the checkpointed chunks equal the plain ones
    weight = torch.randn(want_lp.shape, generator=torch.Generator().manual_seed(1))
    grads = []
    for fn in (
        lambda: _reference_log_probs(model, ids, mask),
        lambda: token_log_probs(model, ids, mask, with_entropy=True, pack=pack, chunk_tokens=chunk),
    ):
        model.zero_grad()
        lp, ent = fn()
        ((lp * weight).sum() + 0.1 * (ent * weight).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_pack_layout_restarts_positions():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    layout = pack_layout(mask)
    assert layout.index.tolist() == [0, 1, 2, 4, 5]
    assert layout.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert layout.scored.tolist() == [True, True, False, True, False]


# ---------------------------------------------------------------- the training step (DeepSpeed, CPU)
def _strategy(model_dir, stage=0, dynamic=False, pack=False, per_device=2, accum=4):
    from roll.config.worker import WorkerConfig
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = True
    cfg.strategy_args.strategy_name = "deepspeed_train"
    cfg.strategy_args.strategy_config = {"zero_stage": stage}
    cfg.training_args.per_device_train_batch_size = per_device
    cfg.training_args.gradient_accumulation_steps = accum
    cfg.training_args.learning_rate = 1e-2
    cfg.use_dynamic_batching_in_train = dynamic
    cfg.max_tokens_per_microbatch_in_train = 20
    cfg.use_sequence_packing = pack
    strategy = build_strategy(cfg, "actor_train")
    strategy.initialize(StrategyContext(seed=0, max_grad_norm=0.5, total_steps=10))
    return strategy


def _plain_step(model_dir, batch, loss_fn, max_norm=0.5):
    """The whole batch in one forward with full logits, gradients clipped to ``max_norm``: the clipped
    gradients, the pre-clip norm and the loss."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lp, ent = _reference_log_probs(model, batch["input_ids"], batch["attention_mask"])
    loss, _ = loss_fn(lp, ent, batch)
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    return {n: p.grad for n, p in model.named_parameters()}, norm, float(loss.detach())


def _applied_grads(strategy):
    """The clipped gradients of a ZeRO-0 strategy's first optimizer step, read back from Adam's first moment
    (after one step ``exp_avg = (1 - beta1) g``): exact, where comparing weights would amplify float noise of
    near-zero gradients (Adam's first update is about ``lr * sign(g)``)."""
    beta1 = strategy.config.training_args.adam_beta1
    state = strategy.torch_optimizer.state
    return {n: state[p]["exp_avg"] / (1 - beta1) for n, p in strategy.engine.module.named_parameters()}


def _weights(strategy):
    return dict(strategy.named_weights())


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_train_step_micro_batching_is_exact(tiny_model_dir, dist_env, mode):
    """Fixed padded micro-batches, token-budget padded ones and token-budget packed ones all make the update of
    the whole batch computed at once (plain torch)."""
    batch = _batch()
    loss_fn = PPOActorLoss(ActorLossConfig(loss_agg_mode=mode))  # no old log-probs: ratio 1, loss = -mean(A)
    want, want_norm, want_loss = _plain_step(tiny_model_dir, batch, loss_fn)
    assert want_norm > 0  # a gradient to compare: zero on both sides would be "equal"
    for dynamic, pack in [(False, False), (True, False), (True, True)]:
        strategy = _strategy(tiny_model_dir, dynamic=dynamic, pack=pack)
        metrics = strategy.train_step(batch, loss_fn)
        assert metrics["actor/grad_norm"] == pytest.approx(want_norm, rel=1e-4)
        assert metrics["actor/pg_loss"] == pytest.approx(want_loss, rel=1e-4, abs=1e-6)
        got = _applied_grads(strategy)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, atol=1e-6, rtol=1e-4, msg=f"{name} {dynamic} {pack}")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_grad_norm_is_the_pre_clip_global_norm(tiny_model_dir, dist_env, stage):
    batch = _batch()
    _, want_norm, _ = _plain_step(tiny_model_dir, batch, SFT_LOSS)
    strategy = _strategy(tiny_model_dir, stage=stage)
    metrics = strategy.train_step(batch, SFT_LOSS)
    assert want_norm > 0.5  # the clip is active, so a post-clip norm would read 0.5
    assert metrics["actor/grad_norm"] == pytest.approx(want_norm, rel=1e-4)


def test_skipped_old_log_probs_give_the_same_loss_and_update(tiny_model_dir, dist_env):
    """With one optimizer step, the old log-probs of a separate pass equal the training forward's: the same
    loss, metrics and weights with or without the pass; the step returns those log-probs."""
    batch = _batch()
    loss_fn = PPOActorLoss(ActorLossConfig(loss_agg_mode="token-mean", pg_clip=0.1))
    with_pass = _strategy(tiny_model_dir, dynamic=True, pack=True)
    old = with_pass.compute_log_probs(batch)["log_probs"]
    full = Batch(dict(batch.tensors, old_log_probs=old))
    a = with_pass.train_step(full, loss_fn)
    skipped = _strategy(tiny_model_dir, dynamic=True, pack=True)
    b = skipped.train_step(batch, loss_fn, return_log_probs=True)
    kept = b.pop("log_probs")
    mask = batch["attention_mask"][:, 1:].bool() & batch["attention_mask"][:, :-1].bool()
    torch.testing.assert_close(kept[mask], old[mask], atol=1e-6, rtol=1e-6)
    assert set(a) == set(b)
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    ga, gb = _applied_grads(with_pass), _applied_grads(skipped)
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-7, rtol=1e-5)


def test_left_padded_rows_keep_their_mask(tiny_model_dir):
    """Right-padded rows run unmasked (causal only: exact for real tokens); left padding keeps the mask."""
    from transformers import AutoModelForCausalLM

    from roll.models.logprobs import is_right_padded

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = _batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    left_ids, left_mask = torch.zeros_like(ids), torch.zeros_like(mask)
    for i, n in enumerate(LENGTHS):  # the same rows, left padded
        left_ids[i, -n:], left_mask[i, -n:] = ids[i, :n], 1
    assert is_right_padded(mask) and not is_right_padded(left_mask)
    right, _ = token_log_probs(model, ids, mask)
    left, _ = token_log_probs(model, left_ids, left_mask)
    for i, n in enumerate(LENGTHS):
        torch.testing.assert_close(left[i, -(n - 1) :], right[i, : n - 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature, entropy_coef", [(1.0, 0.0), (0.7, 0.3)])
def test_fused_linear_log_probs_match_autograd(temperature, entropy_coef):
    """:class:`LinearLogProbs` (values and hand-derived gradients) equals autograd through full logits."""
    from roll.models.logprobs import LinearLogProbs

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (7,), generator=gen)
    g_lp, g_ent = torch.randn(7, generator=gen, dtype=torch.float64), torch.randn(7, generator=gen, dtype=torch.float64)

    def plain():
        z = (hidden @ weight.t()) / temperature
        logp = torch.log_softmax(z, -1)
        return logp.gather(-1, labels[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)

    results = []
    for fn in (plain, lambda: LinearLogProbs.apply(hidden, weight, labels, temperature, True)):
        hidden.grad = weight.grad = None
        lp, ent = fn()
        ((lp * g_lp).sum() + entropy_coef * (ent * g_ent).sum()).backward()
        results.append((lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()))
    for want, got in zip(results[0], results[1]):
        torch.testing.assert_close(got.to(want.dtype), want, atol=1e-5, rtol=1e-5)  # the fused pass is fp32
