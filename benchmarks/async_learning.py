"""Does asynchronous training learn as well as synchronous training at the same number of trained samples?
``sokoban_tiny`` with ``async_generation_ratio`` k = 1 and 2 against k = 0, per seed, on CPU.

Per seed (the per-seed overrides of ``benchmarks/seeds.py``): one warm start (the config's supervised phase, no RL,
saved), then one RL run per k from those same weights: ``--steps`` steps of ``rollout_batch_size`` trajectories
each (so every k trains on the same number of samples; ``max_train_minutes`` off), validated on the same rooms
before and after. The table gives validation success after RL per k, the change from the shared warm start, and per
k >= 1 the paired difference to k = 0 with its mean over seeds and standard error (sd / sqrt(n)).

    python benchmarks/async_learning.py --seeds 1 2 3 4 5 --out output/async_learning
    python benchmarks/async_learning.py --seeds 1 2 3 4 5 --out output/async_learning --summarize
    python benchmarks/async_learning.py --seeds 1 --steps 10 --val-rooms 64 --out output/al   # a quick look
    python benchmarks/async_learning.py --correction ...   # also k = 1, 2 with the truncated IS weight (k1c, k2c)

On 2 cores a seed takes about (warm start) + 3 x (RL steps + 2 validations): ~25 minutes at the defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seeds import ROOT, seed_overrides  # noqa: E402

START = ROOT / "examples" / "start_agentic_pipeline.py"
KS = (0, 1, 2)
#: ``--correction``'s runs: k >= 1 with decoupled PPO's truncated token importance weight (docs/async.md)
IS_WEIGHT = [
    "train_infer_correction.is_weight.enabled=true",
    "train_infer_correction.is_weight.weight_type=token",
    "train_infer_correction.is_weight.upper_bound=2.0",
]


def variants(correction: bool) -> dict[str, tuple[int, list[str]]]:
    """Run name -> (k, extra overrides): ``k0``, ``k1``, ``k2``, and with ``correction`` ``k1c``, ``k2c``."""
    out = {f"k{k}": (k, []) for k in KS}
    if correction:
        out.update({f"k{k}c": (k, IS_WEIGHT) for k in KS[1:]})
    return out


def label(name: str) -> str:
    return f"k={name[1:].rstrip('c')}" + (" + IS weight" if name.endswith("c") else "")


def launch(overrides: list[str], log: Path) -> None:
    """One pipeline run of ``sokoban_tiny`` with ``overrides``, output to ``log``; raises on a non-zero exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(START), "--config-name", "sokoban_tiny", *overrides]
    print(f"[async_learning] {' '.join(cmd[2:])}", flush=True)
    with log.open("w") as out:
        if subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT) != 0:
            raise RuntimeError(f"run failed; see {log}")


def val_success(run_dir: Path) -> dict[int, float]:
    """Validation success by step from a run's ``metrics.jsonl``."""
    out = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "val/success_rate" in row:
            out[int(row["step"])] = float(row["val/success_rate"])
    return out


def run_seed(seed: int, out: Path, steps: int, val_rooms: int, extra: list[str], correction: bool = False) -> None:
    """The warm start, then the RL run of every variant (skipping finished ones)."""
    base = out / f"seed{seed}"
    warm = base / "warm"
    val = [f"val_env_manager.env_groups={val_rooms}", "zero_signal_patience=0", "max_train_minutes=0"]
    if not (warm / "final" / "config.json").exists():
        launch([*seed_overrides(seed, warm), "max_steps=0", "eval_steps=0", *val, *extra], warm / "run.log")
    for name, (k, overrides) in variants(correction).items():
        run_dir = base / name
        if (run_dir / "final" / "config.json").exists():
            continue
        launch(
            [
                f"seed={seed}",
                f"pretrain={warm / 'final'}",
                "tiny_model=null",
                "sft_warmup.enabled=false",
                f"output_dir={run_dir}",
                f"logging_dir={run_dir / 'logs'}",
                f"max_steps={steps}",
                f"eval_steps={steps}",
                f"async_generation_ratio={k}",
                "save_steps=0",
                *overrides,
                *val,
                *extra,
            ],
            run_dir / "run.log",
        )


def table(out: Path, seeds: list[int], correction: bool = False) -> str:
    """Markdown: per seed, success after the warm start and after RL per variant; then the paired differences to
    k=0."""
    names = list(variants(correction))
    head = ["seed", "after warm start"] + [label(n) for n in names] + [f"{label(n)} - k=0" for n in names[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    diffs: dict[str, list[float]] = {n: [] for n in names[1:]}
    finals: dict[str, list[float]] = {n: [] for n in names}
    for seed in seeds:
        runs = {
            n: val_success(out / f"seed{seed}" / n)
            for n in names
            if (out / f"seed{seed}" / n / "logs" / "metrics.jsonl").exists()
        }
        if len(runs) < len(names) or any(len(r) < 2 for r in runs.values()):
            continue
        first = runs["k0"][min(runs["k0"])]
        last = {n: r[max(r)] for n, r in runs.items()}
        for n in names:
            finals[n].append(100 * last[n])
        cells = [str(seed), f"{100 * first:.1f}%"] + [f"{100 * last[n]:.1f}%" for n in names]
        for n in names[1:]:
            diffs[n].append(100 * (last[n] - last["k0"]))
            cells.append(f"{diffs[n][-1]:+.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    count = len(diffs[names[1]])
    if count >= 2:
        mean = [
            f"{statistics.fmean(finals[n]):.1f}% +- {statistics.stdev(finals[n]) / math.sqrt(count):.1f}" for n in names
        ]
        dm = [
            f"{statistics.fmean(diffs[n]):+.1f} +- {statistics.stdev(diffs[n]) / math.sqrt(count):.1f}"
            for n in names[1:]
        ]
        lines.append("| mean +- stderr | |" + "".join(f" {c} |" for c in mean + dm))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog="Arguments after -- are extra Hydra overrides for every run."
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--steps", type=int, default=40, help="RL steps of every run (64 trajectories each)")
    parser.add_argument("--val-rooms", type=int, default=256, help="validation rooms (val_env_manager.env_groups)")
    parser.add_argument("--out", type=Path, default=Path("output/async_learning"))
    parser.add_argument("--summarize", action="store_true", help="only tabulate runs already in --out")
    parser.add_argument(
        "--correction",
        action="store_true",
        help="also run k = 1 and 2 with the truncated token importance weight (k1c, k2c)",
    )
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    out = args.out.resolve()
    if not args.summarize:
        for seed in args.seeds:
            run_seed(seed, out, args.steps, args.val_rooms, extra, args.correction)
    print(table(out, args.seeds, args.correction))
    return 0


if __name__ == "__main__":
    sys.exit(main())
