"""docs/verified.md's gateway comparison: Sokoban played by roll's env manager (``sokoban_tiny``) and by an agent
harness written against the OpenAI API through the gateway (``sokoban_agent_tiny``), from the same weights.

Per seed (the per-seed overrides of ``benchmarks/seeds.py``): one warm start (``sokoban_tiny``'s supervised phase,
no RL, saved), then one RL run per side from those weights: ``--max-steps`` steps of the config's batch
(``max_train_minutes`` off, so both sides train on the same number of episodes), validated on the same
``--val-groups`` rooms before and after, each side through its own harness. Prints a markdown table (rollout
success per step, validation success at start and end, the trainer's recomputed-vs-recorded log-prob gap), the
paired gateway - native differences with their mean over seeds and standard error (sd / sqrt(n)), and writes the
table and the curves' data to ``--out``.

Usage: ``python scripts/verify_agent_gateway.py [--seeds 1 2 3] [--max-steps 20] [--sft-steps 300]
[--val-groups 128] [--override distributed=local ...]`` (each run is one ``examples/start_agentic_pipeline.py``
process; runs go one after another; a finished run is reused, ``--summarize`` only reads them).

Smoke mode (CI runs it, ``tests/scripts/test_gpu_scripts_smoke.py``): ``--smoke [DIR]``: one seed, a 4-step warm
start, 2 RL steps per side on 4 validation rooms, the tiny model and sizes of ``scripts/cpu_smoke.py``, in one process
each (``distributed=local``); runs and table in DIR (default ``output/smoke``)/verify_agent_gateway.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from compare_metrics import load  # noqa: E402
from seeds import seed_overrides  # noqa: E402

CONFIGS = {"native": "sokoban_tiny", "gateway": "sokoban_agent_tiny"}


def launch(config: str, overrides: list[str], run_dir: Path) -> None:
    """One pipeline run, its output in ``run_dir/run.log``; raises on a non-zero exit."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "examples" / "start_agentic_pipeline.py"), "--config-name", config, *overrides]
    print("+", " ".join(cmd[2:]), flush=True)
    with (run_dir / "run.log").open("w") as log:
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Path]:
    """The shared warm start, then each side's RL run (finished runs are reused); returns their metrics files."""
    base = Path(args.out) / f"seed{seed}"
    common = [
        "zero_signal_patience=0",
        "max_train_minutes=0",
        f"val_env_manager.env_groups={args.val_groups}",
        "save_steps=0",
        "trajectory_dump_steps=0",
        *args.override,
    ]
    warm = base / "warm"
    if not args.summarize and not (warm / "final" / "config.json").exists():
        launch(
            "sokoban_tiny",
            [
                *seed_overrides(seed, warm),
                "max_steps=0",
                "eval_steps=0",
                f"sft_warmup.steps={args.sft_steps}",
                *args.model_override,
                *common,
            ],
            warm,
        )
    metrics = {}
    for mode, config in CONFIGS.items():
        run_dir = base / mode
        if not args.summarize and not (run_dir / "final" / "config.json").exists():
            launch(
                config,
                [
                    f"seed={seed}",
                    f"pretrain={warm / 'final'}",
                    "tiny_model=null",
                    "sft_warmup.enabled=false",
                    f"max_steps={args.max_steps}",
                    f"eval_steps={args.max_steps}",
                    f"output_dir={run_dir}",
                    f"logging_dir={run_dir / 'logs'}",
                    *common,
                ],
                run_dir,
            )
        metrics[mode] = run_dir / "logs" / "metrics.jsonl"
    return metrics


def summary(metrics: Path, max_steps: int) -> dict:
    steps = load(metrics)
    return {
        "rollout": [steps.get(s, {}).get("rollout/success_rate") for s in range(1, max_steps + 1)],
        "val_start": steps.get(0, {}).get("val/success_rate"),
        "val_end": steps.get(max_steps, {}).get("val/success_rate"),
        "logprob_gap": max(steps.get(s, {}).get("rollout/logprob_mismatch_max", 0.0) for s in range(1, max_steps + 1)),
        "rollout_s": sum(steps.get(s, {}).get("time/rollout", 0.0) for s in range(1, max_steps + 1)),
    }


def mean_se(values: list[float]) -> str:
    """``mean +- standard error`` in points (values are fractions)."""
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{100 * statistics.fmean(values):+.1f} +- {100 * se:.1f}"


def table(results: dict, seeds: list[int]) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        "| run | rollout success per step | val success start -> end | max log-prob gap | rollout s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {' '.join(fmt(v) for v in r['rollout'])} | {fmt(r['val_start'])} -> "
            f"{fmt(r['val_end'])} | {r['logprob_gap']:.1e} | {r['rollout_s']:.0f} |"
        )
    lines.append("")
    lines.append(
        "| per seed | native: val end - start | gateway: val end - start | gateway - native, val end | "
        "rollout success, first 5 -> last 5 steps: native, gateway |"
    )
    lines.append("| --- | --- | --- | --- | --- |")
    ends = lambda r: (statistics.fmean(r["rollout"][:5]), statistics.fmean(r["rollout"][-5:]))  # noqa: E731
    gains, diffs = {m: [] for m in CONFIGS}, []
    for s in seeds:
        n, g = results.get(f"native-s{s}"), results.get(f"gateway-s{s}")
        if not n or not g or None in (n["val_start"], n["val_end"], g["val_start"], g["val_end"]):
            continue
        gains["native"].append(n["val_end"] - n["val_start"])
        gains["gateway"].append(g["val_end"] - g["val_start"])
        diffs.append(g["val_end"] - n["val_end"])
        (n0, n1), (g0, g1) = ends(n), ends(g)
        lines.append(
            f"| seed {s} | {100 * gains['native'][-1]:+.1f} | {100 * gains['gateway'][-1]:+.1f} | "
            f"{100 * diffs[-1]:+.1f} | {n0:.3f} -> {n1:.3f}, {g0:.3f} -> {g1:.3f} |"
        )
    if diffs:
        lines.append(
            f"| mean +- stderr (points) | {mean_se(gains['native'])} | {mean_se(gains['gateway'])} | "
            f"{mean_se(diffs)} | |"
        )
    return "\n".join(lines)


def smoke_args(args: argparse.Namespace) -> None:
    """``--smoke``: the study shrunk to a minute (see the module docstring)."""
    from scripts.cpu_smoke import MODEL, SOKOBAN_SIZES

    args.seeds, args.max_steps, args.sft_steps, args.val_groups = [1], 2, 4, 4
    args.out = str(Path(args.smoke) / "verify_agent_gateway")
    cpus = ["actor_train.num_cpus_per_worker=1", "actor_infer.num_cpus_per_worker=1", "sft_warmup.batch_size=8"]
    args.model_override = MODEL  # the warm start builds the model; the RL runs load it
    args.override = ["distributed=local", *SOKOBAN_SIZES, *cpus, *args.override]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--val-groups", type=int, default=128)
    parser.add_argument("--out", default=str(ROOT / "output" / "verify_agent_gateway"))
    parser.add_argument("--summarize", action="store_true", help="read finished runs only")
    parser.add_argument("--override", nargs="*", default=[], help="more config overrides, e.g. distributed=local")
    parser.add_argument(
        "--smoke", nargs="?", const="output/smoke", default=None, metavar="DIR", help="a CPU smoke run (minutes)"
    )
    args = parser.parse_args(argv)
    args.model_override = []
    if args.smoke:
        smoke_args(args)
    results = {}
    for seed in args.seeds:
        for mode, metrics in run_seed(seed, args).items():
            if metrics.exists():
                results[f"{mode}-s{seed}"] = summary(metrics, args.max_steps)
    text = table(results, args.seeds)
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "table.md").write_text(text + "\n")
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
