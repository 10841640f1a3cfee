"""Does RL beat spending the same time on supervised training? Per seed: the config as it is (warm start + RL),
then an SFT-only control that trains on solver demonstrations for the RL run's training time; both validated on
the same rooms.

Per seed (one run at a time, as in ``benchmarks/seeds.py``, whose per-seed overrides are used):

1. **RL**: the config unchanged (warm start, then ``max_steps`` RL steps). Its training time is the warm start
   (``time/sft``) plus every RL step (``time/step``: rollout, log-probs, update, sync); set-up and validation are
   left out, on both sides.
2. **Control**: the same config, initial weights (the RL run's model directory), demonstration seed and validation
   rooms, with ``max_steps=0`` (no RL) and ``max_train_minutes`` = the RL run's training time: its warm start runs
   until that budget is spent. Its step limit is 4 x the steps its pace in the RL run's own warm start predicts
   (the budget, not the limit, ends it: a warm start slowed by other work on the machine underestimates the pace
   2x), with demonstrations for 1.5 x (``num_demos``; beyond them they repeat, which made no difference to the
   control in docs/verified.md). Demonstration generation is not counted on either side.

The table gives validation success after the warm start (the RL run's step 0), after RL, and of the control, the
paired differences, and their mean over seeds with the standard error (sd / sqrt(n)). Once a seed's control ran, the
RL run's ``metrics.png`` is drawn again with the control's level beside the warm start's (``roll view`` of the RL
run shows both too). Validation uses the config's
sampling (temperature 1). ``--greedy`` also re-validates both final models with greedy decoding.

    python benchmarks/rl_vs_sft.py --seeds 1 2 3 4 5 --out output/rl_vs_sft
    python benchmarks/rl_vs_sft.py --seeds 1 2 3 4 5 --out output/rl_vs_sft --summarize
    python benchmarks/rl_vs_sft.py --seeds 1 --out output/rl_vs_sft_lr -- actor_train.training_args.learning_rate=1e-3

Seeds can run side by side, each pinned to its own cores (``taskset -c 0,1 python benchmarks/rl_vs_sft.py --seeds
1 ...``); ``--rl-only`` stops after the RL runs, and a later call without it adds the controls.

``--side-by-side N`` runs the seeds at once instead, N runs at a time, each pinned to two cores of its own
(``taskset``; a machine with 2N cores): every seed's RL run, and its control as soon as that RL run is done (given
its measured training time, as above).

    python benchmarks/rl_vs_sft.py --seeds 1 2 3 4 5 --out output/rl_vs_sft --side-by-side 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seeds import ROOT, seed_overrides, validation_curve  # noqa: E402

START = ROOT / "examples" / "start_agentic_pipeline.py"


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` in the repo root with output to ``log``; wall seconds. Raises on a non-zero exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[rl_vs_sft] {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise RuntimeError(f"exit code {rc}; see {log}")
    return time.perf_counter() - start


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


def training_time(rows: list[dict]) -> tuple[float, float, int]:
    """(warm start seconds, RL step seconds summed, RL steps) of a run's ``metrics.jsonl``."""
    sft = sum(r.get("time/sft", 0.0) for r in rows)
    steps = [r["time/step"] for r in rows if "time/step" in r]
    return sft, sum(steps), len(steps)


def control_overrides(
    rl_dir: Path, run_dir: Path, steps: int, batch: int, seconds: float, demos: int | None = None
) -> list[str]:
    """The control's overrides on top of the seed's: the RL run's initial model, no RL, supervised steps for
    ``seconds`` of training (at most ``steps``) on ``demos`` demonstrations (default: ``steps x batch``)."""
    return [
        f"pretrain={rl_dir / 'model'}",
        f"output_dir={run_dir}",
        f"logging_dir={run_dir / 'logs'}",
        "max_steps=0",
        "eval_steps=1",
        f"sft_warmup.steps={steps}",
        f"sft_warmup.num_demos={demos or steps * batch}",
        f"max_train_minutes={seconds / 60:.4f}",
    ]


def replot(rl_dir: Path) -> None:
    """Draw the RL run's metrics.png again now that its control ran beside it: the success panel gets the control's
    level (``roll.tracking.plot.control_level``; ``roll view`` shows it too)."""
    from roll.tracking.plot import plot_metrics

    metrics = rl_dir / "logs" / "metrics.jsonl"
    try:
        plot_metrics(str(metrics), str(metrics.with_name("metrics.png")))
    except (OSError, ValueError) as exc:  # a plot never fails the study
        print(f"[rl_vs_sft] could not plot {metrics}: {exc}", flush=True)


def greedy_overrides(model: Path, run_dir: Path) -> list[str]:
    """Validate a saved model with greedy decoding: no warm start, no RL."""
    return [
        f"pretrain={model}",
        "tiny_model=null",
        "sft_warmup.enabled=false",
        "max_steps=0",
        "eval_steps=1",
        f"output_dir={run_dir}",
        f"logging_dir={run_dir / 'logs'}",
        "actor_infer.generating_args.do_sample=false",
        "track_with=stdout",
    ]


def sft_config(config_name: str, extra: list[str]) -> tuple[int, int]:
    """(warm-start steps, batch size) of the config with the extra overrides."""
    from roll.config.agentic import AgenticConfig
    from roll.config.loader import load_config

    cfg = load_config(config_name, None, extra, schema=AgenticConfig)
    return cfg.sft_warmup.steps, cfg.sft_warmup.batch_size


def control_args(
    args: argparse.Namespace, seed: int, rl_dir: Path, ctl_dir: Path, sft_steps: int, batch: int
) -> list[str]:
    """The control's overrides: the seed's, the study's extra ones, then the control's own (the RL run's initial
    model and measured training time, a step limit of 4 x the steps its warm-start pace predicts, demonstrations
    for 1.5 x)."""
    sft_s, rl_s, _ = training_time(read_rows(rl_dir))
    paced = (sft_s + rl_s) / (sft_s / sft_steps)
    steps = max(sft_steps, round(4 * paced))
    own = control_overrides(rl_dir, ctl_dir, steps, batch, sft_s + rl_s, max(sft_steps, round(1.5 * paced)) * batch)
    keys = {o.split("=", 1)[0] for o in own}  # the control's values replace the study's for these keys
    return seed_overrides(seed, ctl_dir) + [o for o in args.extra if o.split("=", 1)[0].lstrip("+") not in keys] + own


def run_seed(args: argparse.Namespace, seed: int, sft_steps: int, batch: int) -> None:
    """The RL run, then its control (and the greedy re-validations); skips parts whose results exist."""
    rl_dir, ctl_dir = (args.out / f"seed{seed}" / "rl").resolve(), (args.out / f"seed{seed}" / "control").resolve()
    base = [sys.executable, str(START), "--config-name", args.config_name]
    if not (rl_dir / "final").exists():
        wall = run(base + seed_overrides(seed, rl_dir) + args.extra, rl_dir / "run.log")
        (rl_dir / "wall_s").write_text(f"{wall:.1f}")
    if args.rl_only:
        return
    if not (ctl_dir / "final").exists():
        wall = run(base + control_args(args, seed, rl_dir, ctl_dir, sft_steps, batch), ctl_dir / "run.log")
        (ctl_dir / "wall_s").write_text(f"{wall:.1f}")
        replot(rl_dir)
    if args.greedy:
        for name, model in (("rl", rl_dir / "final"), ("control", ctl_dir / "final")):
            out = args.out.resolve() / f"seed{seed}" / f"greedy_{name}"
            if not (out / "logs" / "metrics.jsonl").exists():
                run(base + seed_overrides(seed, out) + args.extra + greedy_overrides(model, out), out / "run.log")


def side_by_side(args: argparse.Namespace, sft_steps: int, batch: int) -> None:
    """Every seed's RL run, then its control as soon as that RL run is done (given the RL run's measured training
    time, as in :func:`run_seed`), ``args.side_by_side`` runs at a time, each pinned to two cores of its own."""
    base = [sys.executable, str(START), "--config-name", args.config_name]
    pending = list(args.seeds)  # seeds whose RL run has not started
    waiting = [] if args.rl_only else list(args.seeds)  # seeds whose control has not started
    running: list[tuple[subprocess.Popen, Path, float, int]] = []
    slots = list(range(min(args.side_by_side, ((os.cpu_count() or 2) - args.first_core) // 2)))

    def rl_done(seed: int) -> bool:
        return (args.out / f"seed{seed}" / "rl" / "wall_s").exists()

    def start(run_dir: Path, cmd: list[str]) -> None:
        slot = slots.pop(0)
        first = args.first_core + 2 * slot
        run_dir.mkdir(parents=True, exist_ok=True)
        print(f"[rl_vs_sft] cores {first},{first + 1}: {' '.join(cmd[1:])}", flush=True)
        with (run_dir / "run.log").open("w") as log:
            proc = subprocess.Popen(["taskset", "-c", f"{first},{first + 1}", *cmd], cwd=ROOT, stdout=log, stderr=log)
        running.append((proc, run_dir, time.perf_counter(), slot))

    while pending or waiting or running:
        for seed in [s for s in waiting if rl_done(s)]:
            if not slots:
                break
            waiting.remove(seed)
            rl_dir, ctl_dir = (
                (args.out / f"seed{seed}" / "rl").resolve(),
                (args.out / f"seed{seed}" / "control").resolve(),
            )
            if (ctl_dir / "wall_s").exists():
                continue
            start(ctl_dir, base + control_args(args, seed, rl_dir, ctl_dir, sft_steps, batch))
        while pending and slots:
            seed = pending.pop(0)
            rl_dir = (args.out / f"seed{seed}" / "rl").resolve()
            if not rl_done(seed):
                start(rl_dir, base + seed_overrides(seed, rl_dir) + args.extra)
        time.sleep(2)
        for item in list(running):
            proc, run_dir, began, slot = item
            if proc.poll() is None:
                continue
            running.remove(item)
            slots.append(slot)
            if proc.returncode == 0:
                (run_dir / "wall_s").write_text(f"{time.perf_counter() - began:.1f}")
            else:
                waiting = [s for s in waiting if run_dir != (args.out / f"seed{s}" / "rl").resolve()]
            print(f"[rl_vs_sft] {run_dir}: exit {proc.returncode}", flush=True)
    for seed in args.seeds:
        if (args.out / f"seed{seed}" / "control" / "wall_s").exists():
            replot((args.out / f"seed{seed}" / "rl").resolve())


def seed_row(args: argparse.Namespace, seed: int) -> dict | None:
    """One seed's numbers from its finished runs (None if the RL run or its control is missing)."""
    rl_dir, ctl_dir = args.out / f"seed{seed}" / "rl", args.out / f"seed{seed}" / "control"
    if not (rl_dir / "wall_s").exists() or not (ctl_dir / "wall_s").exists():
        return None
    curve, episodes = validation_curve(rl_dir / "logs" / "metrics.jsonl")
    control, _ = validation_curve(ctl_dir / "logs" / "metrics.jsonl")
    rl_rows, ctl_rows = read_rows(rl_dir), read_rows(ctl_dir)
    sft_s, rl_s, rl_steps = training_time(rl_rows)
    row = {
        "seed": seed,
        "episodes": episodes,
        "warm": curve[0][1],
        "rl": curve[-1][1],
        "control": control[-1][1],
        "curve": curve,
        "rl_train_s": sft_s + rl_s,
        "rl_steps": rl_steps,
        "control_train_s": training_time(ctl_rows)[0],
        "control_sft_steps": next(r["sft/steps"] for r in ctl_rows if "sft/steps" in r),
        "rl_wall_s": read_number(rl_dir / "wall_s"),
    }
    for name in ("rl", "control"):
        path = args.out / f"seed{seed}" / f"greedy_{name}" / "logs" / "metrics.jsonl"
        if path.exists():
            row[f"{name}_greedy"] = validation_curve(path)[0][-1][1]
    return row


def read_number(path: Path) -> float | None:
    """The number a run wrote to ``path`` (wall seconds, step counts), or None."""
    return float(path.read_text()) if path.exists() else None


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(rows: list[dict]) -> str:
    """Markdown table plus the paired differences' mean and standard error over seeds."""
    greedy = all("rl_greedy" in r and "control_greedy" in r for r in rows)
    head = [
        "seed",
        "warm start",
        "RL",
        "SFT control",
        "RL - control",
        "RL - warm start",
        "RL train / wall",
        "control train",
    ] + (["RL greedy", "control greedy"] if greedy else [])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        se = math.sqrt(sum(v * (1 - v) for v in (r["rl"], r["control"])) / max(1, r["episodes"]))
        wall = f"{r['rl_wall_s'] / 60:.1f} min" if r["rl_wall_s"] else "-"
        cells = [
            str(r["seed"]),
            pct(r["warm"]),
            pct(r["rl"]),
            pct(r["control"]),
            f"{100 * (r['rl'] - r['control']):+.1f} +- {100 * se:.1f}",
            f"{100 * (r['rl'] - r['warm']):+.1f}",
            f"{r['rl_train_s'] / 60:.1f} / {wall}",
            f"{r['control_train_s'] / 60:.1f} min ({r['control_sft_steps']:.0f} steps)",
        ]
        if greedy:
            cells += [pct(r["rl_greedy"]), pct(r["control_greedy"])]
        lines.append("| " + " | ".join(cells) + " |")
    for name, key in (("RL - control", "control"), ("RL - warm start", "warm")):
        diffs = [100 * (r["rl"] - r[key]) for r in rows]
        if len(diffs) >= 2:
            se = statistics.stdev(diffs) / math.sqrt(len(diffs))
            wins = sum(d > 0 for d in diffs)
            lines.append(
                f"{name}: mean {statistics.mean(diffs):+.1f} points (SE {se:.1f}, paired over "
                f"{len(diffs)} seeds); positive on {wins} of {len(diffs)}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog="Arguments after -- are extra Hydra overrides for every run."
    )
    parser.add_argument("--config-name", default="sokoban_tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--out", type=Path, default=Path("output/rl_vs_sft"))
    parser.add_argument("--greedy", action="store_true", help="also validate both final models greedily")
    parser.add_argument("--summarize", action="store_true", help="only tabulate runs already in --out")
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=0,
        metavar="N",
        help="run the RL runs and controls at once, N at a time, two cores each (the control gets the config's budget)",
    )
    parser.add_argument("--first-core", type=int, default=0, help="with --side-by-side: pin from this core on")
    parser.add_argument(
        "--rl-only",
        action="store_true",
        help="only the RL runs (a later call without it runs the controls: finished parts are kept)",
    )
    args, extra = parser.parse_known_args(argv)
    args.extra = [x for x in extra if x != "--"]
    if not args.summarize:
        sft_steps, batch = sft_config(args.config_name, args.extra)
        if args.side_by_side:
            side_by_side(args, sft_steps, batch)
        for seed in [] if args.side_by_side else args.seeds:
            run_seed(args, seed, sft_steps, batch)
        if args.rl_only:
            return 0
    rows = [r for r in (seed_row(args, s) for s in args.seeds) if r is not None]
    if not rows:
        print("[rl_vs_sft] no finished seeds to tabulate", file=sys.stderr)
        return 1
    print(table(rows))
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
