"""Subprocess helper for test_ds_fragments.py: one DeepSpeed train_step on CPU per fragment.

Usage: python ds_fragment_worker.py MODEL_DIR PORT FRAGMENT[,FRAGMENT...]; prints
``RESULT <fragment> <optimizer_steps> <max |weight change|>`` per fragment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(model_dir: str, port: str, fragments: list[str]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", DS_ACCELERATOR="cpu"
    )
    import torch
    from omegaconf import OmegaConf

    from roll.config.worker import StrategyArgs, WorkerConfig
    from roll.data.batch import Batch
    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
    from roll.strategies.registry import strategy_options

    def loss_fn(log_probs, entropy, mb):
        loss = -log_probs.mean()
        return loss, {"loss": float(loss.detach())}

    for name in fragments:
        block = OmegaConf.to_container(OmegaConf.load(REPO / "examples" / "config" / f"{name}.yaml"))[name]
        worker = WorkerConfig(strategy_args=StrategyArgs("deepspeed_train", block))
        worker.model_args.model_name_or_path = model_dir
        worker.model_args.disable_gradient_checkpointing = True
        ta = worker.training_args
        ta.per_device_train_batch_size, ta.gradient_accumulation_steps, ta.learning_rate = 2, 2, 1e-2
        strategy = DeepSpeedTrainStrategy(worker, options=strategy_options(worker))
        strategy.initialize(StrategyContext(seed=0, total_steps=10))
        before = [t.clone() for _, t in strategy.named_weights()]
        ids = torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(0))
        strategy.train_step(Batch(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)}, meta={}), loss_fn)
        after = [t for _, t in strategy.named_weights()]
        delta = max((a - b).abs().max().item() for a, b in zip(after, before))
        print(f"RESULT {name} {strategy.optimizer_steps} {delta}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3].split(","))
