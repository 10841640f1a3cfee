"""docs/verified.md's gateway comparison: Sokoban played by roll's env manager (``sokoban_tiny``) and by an agent
harness written against the OpenAI API through the gateway (``sokoban_agent_tiny``), same seeds, same warm start,
same steps. Prints a markdown table (rollout success per step, validation success at start and end, the trainer's
recomputed-vs-recorded log-prob gap) and writes it with the curves' data to ``--out``.

Usage: ``python scripts/verify_agent_gateway.py [--seeds 1 2 3] [--max-steps 6] [--sft-steps 60] [--val-groups 64]
[--override distributed=local ...]`` (each run is one ``examples/start_agentic_pipeline.py`` process; runs go one
after another; a run whose output is complete is reused).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from compare_metrics import load  # noqa: E402

CONFIGS = {"native": "sokoban_tiny", "gateway": "sokoban_agent_tiny"}


def run(config: str, seed: int, args: argparse.Namespace) -> Path:
    """One training run; returns its metrics.jsonl (an existing complete run is reused)."""
    out = Path(args.out) / f"{config}-s{seed}"
    metrics = out / "logs" / "metrics.jsonl"
    if metrics.exists() and (out / "final").exists():
        return metrics
    cmd = [sys.executable, str(ROOT / "examples" / "start_agentic_pipeline.py"), "--config-name", config,
           f"seed={seed}", f"max_steps={args.max_steps}", "max_train_minutes=0", f"sft_warmup.steps={args.sft_steps}",
           f"eval_steps={args.max_steps}", f"val_env_manager.env_groups={args.val_groups}", "save_steps=0",
           "trajectory_dump_steps=0", "zero_signal_patience=0", f"output_dir={out}", f"logging_dir={out / 'logs'}",
           *args.override]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return metrics


def summary(metrics: Path, max_steps: int) -> dict:
    steps = load(metrics)
    return {"rollout": [steps.get(s, {}).get("rollout/success_rate") for s in range(1, max_steps + 1)],
            "val_start": steps.get(0, {}).get("val/success_rate"),
            "val_end": steps.get(max_steps, {}).get("val/success_rate"),
            "logprob_gap": max(steps.get(s, {}).get("rollout/logprob_mismatch_max", 0.0)
                               for s in range(1, max_steps + 1)),
            "rollout_s": sum(steps.get(s, {}).get("time/rollout", 0.0) for s in range(1, max_steps + 1))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--val-groups", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "output" / "verify_agent_gateway"))
    parser.add_argument("--override", nargs="*", default=[], help="more config overrides, e.g. distributed=local")
    args = parser.parse_args()
    results = {}
    for seed in args.seeds:
        for mode, config in CONFIGS.items():
            results[f"{mode}-s{seed}"] = summary(run(config, seed, args), args.max_steps)
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["| run | rollout success per step | val success start -> end | max log-prob gap | rollout s |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        lines.append(f"| {name} | {' '.join(fmt(v) for v in r['rollout'])} | {fmt(r['val_start'])} -> "
                     f"{fmt(r['val_end'])} | {r['logprob_gap']:.1e} | {r['rollout_s']:.0f} |")
    for mode in CONFIGS:
        ends = [results[f"{mode}-s{s}"]["val_end"] for s in args.seeds]
        starts = [results[f"{mode}-s{s}"]["val_start"] for s in args.seeds]
        if None not in ends and None not in starts:
            lines.append(f"| {mode} mean | | {sum(starts) / len(starts):.3f} -> {sum(ends) / len(ends):.3f} | | |")
    table = "\n".join(lines)
    print(table)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "table.md").write_text(table + "\n")
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
