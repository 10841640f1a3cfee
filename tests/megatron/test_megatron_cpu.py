"""megatron_train on CPU (gloo, megatron-core's local layers through tests/megatron/mcore_cpu.py's shim).

Checks against transformers and between parallel layouts, on a tiny Qwen2 (GQA, QKV bias, tied embeddings):
log-probs and entropy equal HF's forward; the exported weights are HF's names and values; one optimizer step on
TP=2 (two processes) equals TP=1 (loss, gradient norm, new weights); a distributed checkpoint resumes exactly;
``save_pretrained`` writes a directory transformers loads.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.megatron.mcore_cpu import run_ranks  # noqa: E402

IDS_SEED = 0


def _batch():
    from roll.data.batch import Batch

    g = torch.Generator().manual_seed(IDS_SEED)
    ids = torch.randint(0, 500, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # one right-padded sample
    return Batch({"input_ids": ids, "attention_mask": mask})


def loss_fn(log_probs, entropy, mb):
    """Masked mean NLL minus an entropy bonus (both paths of the vocab-parallel computation carry gradient)."""
    mask = mb["attention_mask"][:, 1:].float()
    loss = -(log_probs * mask).sum() / mask.sum() - 0.1 * (entropy * mask).sum() / mask.sum()
    return loss, {"loss": float(loss.detach())}


def _strategy(rank, model_dir, tp, cls="MegatronTrainStrategy", **options):
    from roll.config.worker import WorkerConfig
    from roll.strategies import megatron_train
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import strategy_options

    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.training_args.learning_rate = 1e-3
    cfg.training_args.per_device_train_batch_size = 4
    cfg.strategy_args.strategy_name = "megatron_train"
    cfg.strategy_args.strategy_config = {"tensor_model_parallel_size": tp, **options}
    strategy = getattr(megatron_train, cls)(cfg, rank, tp, options=strategy_options(cfg))
    strategy.initialize(StrategyContext(seed=1, max_grad_norm=1.0, total_steps=4))
    return strategy


def _score_and_step(rank, model_dir, tp, sequence_parallel=False, export_dir=None):
    """Log-probs and weights before and after one step; with ``export_dir`` (TP=1), also ``save_pretrained`` there
    and the log-probs after the step."""
    s = _strategy(rank, model_dir, tp, sequence_parallel=sequence_parallel)
    before = s.compute_log_probs(_batch(), with_entropy=True)
    weights0 = dict(s.named_weights())
    metrics = s.train_step(_batch(), loss_fn, with_entropy=True)
    out = {
        "before": before,
        "weights0": weights0,
        "metrics": metrics,
        "weights1": dict(s.named_weights()),
        "info": s.data_parallel_info(),
    }
    if export_dir is not None:
        s.save_pretrained(export_dir)
        out["after"] = s.compute_log_probs(_batch())["log_probs"]
    return out


@pytest.fixture(scope="module")
def tp1(tiny_model_dir, tmp_path_factory):
    """TP=1, one process (megatron-core's start is seconds): scored, stepped and exported to ``tp1["export"]``."""
    export = tmp_path_factory.mktemp("megatron") / "hf"
    return {**run_ranks(_score_and_step, 1, tiny_model_dir, 1, False, str(export))[0], "export": export}


def test_log_probs_entropy_and_weights_equal_transformers(tiny_model_dir, tp1):
    from transformers import AutoModelForCausalLM

    from roll.models.logprobs import token_log_probs

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = _batch()
    ref, ent = token_log_probs(hf, batch["input_ids"], batch["attention_mask"], with_entropy=True)
    real = batch["attention_mask"][:, 1:].bool()
    assert (tp1["before"]["log_probs"] - ref)[real].abs().max() < 1e-5
    assert (tp1["before"]["entropy"] - ent)[real].abs().max() < 1e-5
    params = dict(hf.named_parameters())
    assert sorted(tp1["weights0"]) == sorted(params)
    assert all(torch.equal(tp1["weights0"][n], params[n].detach()) for n in params)
    assert tp1["info"] == (0, 1, True)


@pytest.mark.slow
def test_tp2_step_equals_tp1(tiny_model_dir, tp1):
    ranks = run_ranks(_score_and_step, 2, tiny_model_dir, 2)
    tp2 = ranks[0]
    assert [r["info"] for r in ranks] == [(0, 1, True), (0, 1, False)]  # one replica; TP rank 0 collects
    assert abs(tp2["metrics"]["loss"] - tp1["metrics"]["loss"]) < 1e-5
    assert tp1["metrics"]["actor/grad_norm"] > 0.1  # two zero norms would be "equal"
    assert abs(tp2["metrics"]["actor/grad_norm"] - tp1["metrics"]["actor/grad_norm"]) < 1e-4
    assert (tp2["before"]["log_probs"] - tp1["before"]["log_probs"]).abs().max() < 1e-5
    for run in (tp1, tp2):  # both moved: Adam's first step moves weights by about lr (1e-3)
        assert max((run["weights1"][n] - run["weights0"][n]).abs().max() for n in run["weights0"]) > 5e-4
    # Adam's first step is lr * g / (|g| + eps): a gradient near eps turns its ~1e-7 relative difference (another
    # reduction order) into a few percent of lr on a handful of weights; everything else agrees to ~1e-8
    diffs = torch.cat([(tp2["weights1"][n] - tp1["weights1"][n]).abs().flatten() for n in tp1["weights1"]])
    assert diffs.max() < 5e-5 and diffs.mean() < 1e-7


def _resume(rank, model_dir, ckpt):
    s = _strategy(rank, model_dir, 1)
    s.train_step(_batch(), loss_fn, with_entropy=True)
    s.save_checkpoint(ckpt)
    straight = s.train_step(_batch(), loss_fn, with_entropy=True)
    w_straight = dict(s.named_weights())
    fresh = _strategy(rank, model_dir, 1)
    fresh.load_checkpoint(ckpt)
    resumed = fresh.train_step(_batch(), loss_fn, with_entropy=True)
    return straight, w_straight, resumed, dict(fresh.named_weights()), fresh.optimizer_steps


@pytest.mark.slow
def test_distributed_checkpoint_resumes_exactly(tiny_model_dir, tmp_path):
    straight, w_straight, resumed, w_resumed, steps = run_ranks(_resume, 1, tiny_model_dir, str(tmp_path / "c"))[0]
    assert steps == 2  # the schedule position came back (one step before the save, one after)
    assert straight == resumed
    assert all(torch.equal(w_straight[n], w_resumed[n]) for n in w_straight)


def test_save_pretrained_loads_in_transformers_with_the_trained_weights(tp1):
    from transformers import AutoModelForCausalLM

    from roll.models.logprobs import token_log_probs

    weights, log_probs = tp1["weights1"], tp1["after"]
    model = AutoModelForCausalLM.from_pretrained(tp1["export"])
    assert all(torch.equal(p.detach(), weights[n]) for n, p in model.named_parameters())
    batch = _batch()
    ref, _ = token_log_probs(model, batch["input_ids"], batch["attention_mask"])
    assert (ref - log_probs)[batch["attention_mask"][:, 1:].bool()].abs().max() < 1e-5
