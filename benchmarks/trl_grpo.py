"""TRL's side of ``benchmarks/vs_trl.py``: one ``GRPOTrainer`` run on the shared tiny workload.

Runs in a separate virtualenv that has TRL (``benchmarks/README.md`` says how to make it); roll itself is not
installed there, only its pure-Python math reward is imported from this checkout, so both sides score answers with
the same function. Writes ``<out>/steps.jsonl`` (one ``{"step", "timestamp", "cpu_s"}`` per optimizer step, at its
end; ``cpu_s``: the process's CPU seconds so far; ``rollout_s``: the step's seconds in TRL's
``_generate_and_score_completions``, i.e. generation and reward scoring) and the final model to ``<out>/final``.

    .venv-trl/bin/python benchmarks/trl_grpo.py --model output/vs_trl/start --out output/trl_run --steps 30
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # roll.rewards.math_answer is pure Python; nothing else of roll is imported

from roll.rewards.math_answer import math_reward  # noqa: E402


def load_rows(path: Path) -> list[dict]:
    """The JSONL rows of an RLVR data file (``prompt``, ``ground_truth``, ``tag``)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face directory of the start model")
    parser.add_argument("--train-file", type=Path, default=ROOT / "data" / "math_tiny" / "train.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--system-prompt",
        default="Give the final answer as <answer>N</answer>.",
        help="system message of every prompt; empty: none",
    )
    parser.add_argument(
        "--full-length",
        action="store_true",
        help="generate --max-new-tokens tokens for every sample (min_new_tokens: no early end)",
    )
    args = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows = load_rows(args.train_file)
    system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    dataset = Dataset.from_list(
        [
            {"prompt": [*system, {"role": "user", "content": r["prompt"]}], "ground_truth": str(r["ground_truth"])}
            for r in rows
        ]
    )
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id}

    def reward(prompts, completions, completion_ids, ground_truth, **_):
        """roll's ``math`` reward (format reward 0, as in roll's run) on the decoded completion, stop token cut
        and markup kept, exactly as roll decodes it."""
        texts = tokenizer.batch_decode(
            [[t for t in ids if t not in ends] for ids in completion_ids], skip_special_tokens=False
        )
        return [math_reward(t, g, format_reward=0.0).score for t, g in zip(texts, ground_truth)]

    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "steps.jsonl").open("w")

    rollout = [0.0]

    class TimedGRPOTrainer(GRPOTrainer):
        """Counts the seconds of each step's generation and scoring (``rollout_s``)."""

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                rollout[0] += time.perf_counter() - start

    class StepTimes(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            log.write(
                json.dumps(
                    {
                        "step": state.global_step,
                        "timestamp": time.time(),
                        "cpu_s": time.process_time(),
                        "rollout_s": rollout[0],
                    }
                )
                + "\n"
            )
            log.flush()
            rollout[0] = 0.0

    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=args.seed,
        per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        gradient_checkpointing=False,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
        generation_kwargs={"min_new_tokens": args.max_new_tokens} if args.full_length else None,
    )
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimes()],
    )
    trainer.train()
    log.close()
    trainer.model.save_pretrained(args.out / "final")
    tokenizer.save_pretrained(args.out / "final")
    print(f"[trl] torch threads {torch.get_num_threads()}; final model in {args.out / 'final'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
