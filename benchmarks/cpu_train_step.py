"""CPU training speed of the torch backends on the embedded default's model: one ``train_step`` and one old-log-prob
pass of sokoban_tiny's shape, ``fsdp2_train`` against ``deepspeed_train`` (ZeRO-0 and ZeRO-2), world size 1.

The model is sokoban_tiny's (``tiny_model`` block: hidden 128, 4 layers, vocabulary 1024, ~1M parameters), the
batch one rollout of it (64 samples; lengths drawn uniformly from ``--lengths``), trained as sokoban_tiny does
(8 samples per micro-batch, 2 micro-batches per optimizer step: 4 optimizer steps, fp32, no checkpointing, PPO
loss); the model is built in ``output/models/tiny-qwen2-bench``. Strategies are timed in turn, ``--repeats`` rounds
after a warm-up round, so load drift on a shared machine hits each of them alike; medians and minima go to
``benchmarks/results/cpu_train_step.json``. Only numbers from a quiet machine mean anything (``load_avg`` is kept).

    python benchmarks/cpu_train_step.py --repeats 7
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: name -> (strategy_name, strategy_config)
STRATEGIES = {
    "deepspeed_zero0": ("deepspeed_train", {"zero_stage": 0}),
    "deepspeed_zero2": ("deepspeed_train", {"zero_stage": 2}),
    "fsdp2": ("fsdp2_train", {}),
}


def build(name: str, model_dir: str):
    """A world-size-1 training strategy configured as sokoban_tiny's actor_train."""
    from roll.config.worker import WorkerConfig
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    strategy_name, options = STRATEGIES[name]
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = True
    cfg.strategy_args.strategy_name, cfg.strategy_args.strategy_config = strategy_name, dict(options)
    cfg.training_args.learning_rate = 5e-4
    cfg.training_args.per_device_train_batch_size = 8
    cfg.training_args.gradient_accumulation_steps = 2
    cfg.infer_batch_size = 32
    strategy = build_strategy(cfg, "actor_train")
    strategy.initialize(StrategyContext(seed=0, max_grad_norm=1.0, total_steps=100))
    return strategy


def rollout_batch(samples: int, lengths: tuple[int, int], vocab: int, seed: int = 0):
    """``samples`` right-padded sequences (prompt of 40 tokens, the rest response) with random advantages."""
    import torch

    from roll.data.batch import Batch

    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(lengths[0], lengths[1] + 1, (samples,), generator=gen)
    width = int(lens.max())
    ids = torch.randint(3, vocab, (samples, width), generator=gen)
    mask = (torch.arange(width)[None] < lens[:, None]).long()
    response = mask.clone()
    response[:, :40] = 0
    adv = torch.randn(samples, 1, generator=gen).expand(samples, width - 1).clone()
    return Batch({"input_ids": ids * mask, "attention_mask": mask, "response_mask": response, "advantages": adv})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs=2, default=[150, 450], help="min and max sample length")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (sokoban_tiny: num_cpus_per_worker 2)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    args = parser.parse_args(argv)

    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": os.environ.get("MASTER_PORT", "29517"),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "DS_ACCELERATOR": "cpu",
        }
    )
    import torch

    from roll.algorithms.losses import ActorLossConfig
    from roll.models.tiny import ensure_tiny_model
    from roll.ppo.loss_fns import PPOActorLoss

    torch.set_num_threads(args.threads)
    model_dir = str(
        ensure_tiny_model(
            Path("output/models/tiny-qwen2-bench"),
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1024,
        )
    )
    from transformers import AutoConfig

    batch = rollout_batch(args.samples, tuple(args.lengths), AutoConfig.from_pretrained(model_dir).vocab_size)
    loss = PPOActorLoss(ActorLossConfig(loss_agg_mode="seq-mean-token-mean"))
    strategies = {name: build(name, model_dir) for name in args.strategies}
    times: dict[str, dict[str, list[float]]] = {n: {"train_step": [], "log_probs": []} for n in strategies}
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for name, strategy in strategies.items():
            start = time.perf_counter()
            strategy.compute_log_probs(batch)
            middle = time.perf_counter()
            strategy.train_step(batch, loss)
            end = time.perf_counter()
            if round_:
                times[name]["log_probs"].append(middle - start)
                times[name]["train_step"].append(end - middle)
    summary = {
        name: {
            f"{part}_{stat}_s": fn(values)
            for part, values in parts.items()
            for stat, fn in (("median", statistics.median), ("min", min))
        }
        for name, parts in times.items()
    }
    base = summary.get("deepspeed_zero2")
    for name, row in summary.items():
        print(
            f"{name:16s} train_step median {row['train_step_median_s']:.3f} s (min {row['train_step_min_s']:.3f})"
            f"  log_probs median {row['log_probs_median_s']:.3f} s (min {row['log_probs_min_s']:.3f})"
            + (
                f"  train_step vs ZeRO-2 {row['train_step_median_s'] / base['train_step_median_s']:.2f}x"
                if base
                else ""
            )
        )
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "load_avg": os.getloadavg(),
        "samples": args.samples,
        "lengths": args.lengths,
        "tokens": int(batch["attention_mask"].sum()),
        "repeats": args.repeats,
        "summary": summary,
        "times": times,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cpu_train_step.json").write_text(json.dumps(result, indent=1))
    print(f"[cpu_train_step] results written to {RESULTS / 'cpu_train_step.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
