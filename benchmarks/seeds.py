"""Does RL raise validation success on every seed? Runs one agentic config once per seed and tabulates.

Each seed gets its own RL seed, initial weights (``tiny_model.seed``), demonstration rooms (``sft_warmup.seed``)
and model directory, so the runs share nothing but the config. Runs go one after another (two at once on 2 cores
thrash). The table reads each run's ``metrics.jsonl``: validation success at every evaluation step, and the change
from step 0 (after the warm start) to the last step, with its standard error (sampled decoding, binomial).

    python benchmarks/seeds.py --seeds 1 2 3 --out output/seeds
    python benchmarks/seeds.py --seeds 1 2 3 --out output/seeds --summarize   # re-read finished runs
    python benchmarks/seeds.py --seeds 1 2 --out output/seeds_fp -- train_env_manager.format_penalty=-1.0

Wall time per run is printed too, but compare it only between runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def seed_overrides(seed: int, run_dir: Path) -> list[str]:
    """Hydra overrides that give one seed its own RL seed, initial weights, demonstrations (the default demonstration
    seed + ``seed``) and model directory."""
    from roll.config.agentic import SFTWarmupConfig

    return [
        f"seed={seed}",
        f"tiny_model.seed={seed}",
        f"sft_warmup.seed={SFTWarmupConfig().seed + seed}",
        f"pretrain={run_dir / 'model'}",
        f"output_dir={run_dir}",
        f"logging_dir={run_dir / 'logs'}",
    ]


def validation_curve(metrics_path: Path) -> tuple[list[tuple[int, float]], int]:
    """``([(step, val success), ...], val episodes per evaluation)`` from a run's ``metrics.jsonl``."""
    curve, episodes = [], 0
    for line in metrics_path.read_text().splitlines():
        row = json.loads(line)
        if "val/success_rate" in row:
            curve.append((int(row["step"]), float(row["val/success_rate"])))
            episodes = int(row.get("val/batch_size", episodes))
    return curve, episodes


def gain(curve: list[tuple[int, float]], episodes: int) -> tuple[float, float]:
    """(last - first validation success, standard error of that difference) in points; two binomial estimates."""
    (_, first), (_, last) = curve[0], curve[-1]
    se = math.sqrt((first * (1 - first) + last * (1 - last)) / max(1, episodes))
    return 100 * (last - first), 100 * se


def table(rows: list[tuple[int, list[tuple[int, float]], int, float | None]]) -> str:
    """A markdown table: seed, validation success at each step, change (+- standard error), wall time; then the
    mean change over seeds, whose standard error is ``sqrt(sum se_i^2) / n``."""
    steps = sorted({s for _, curve, _, _ in rows for s, _ in curve})
    head = ["seed"] + [f"val @ {s}" for s in steps] + ["change (points)", "wall"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    gains: list[tuple[float, float]] = []
    for seed, curve, episodes, wall in rows:
        by_step = dict(curve)
        cells = [str(seed)] + [f"{100 * by_step[s]:.1f}%" if s in by_step else "-" for s in steps]
        if len(curve) >= 2:
            d, se = gain(curve, episodes)
            gains.append((d, se))
            cells.append(f"{d:+.1f} +- {se:.1f}")
        else:
            cells.append("-")
        cells.append(f"{wall / 60:.1f} min" if wall is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if len(gains) >= 2:
        mean = sum(d for d, _ in gains) / len(gains)
        se = math.sqrt(sum(e * e for _, e in gains)) / len(gains)
        lines.append("| mean |" + " |" * len(steps) + f" {mean:+.1f} +- {se:.1f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog="Arguments after -- are extra Hydra overrides for every run."
    )
    parser.add_argument("--config-name", default="sokoban_tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("output/seeds"))
    parser.add_argument("--summarize", action="store_true", help="only tabulate runs already in --out")
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    rows = []
    for seed in args.seeds:
        run_dir = (args.out / f"seed{seed}").resolve()
        wall = None
        if not args.summarize:
            cmd = [
                sys.executable,
                str(ROOT / "examples" / "start_agentic_pipeline.py"),
                "--config-name",
                args.config_name,
                *seed_overrides(seed, run_dir),
                *extra,
            ]
            print(f"[seeds] seed {seed}: {' '.join(cmd[1:])}", flush=True)
            start = time.perf_counter()
            rc = subprocess.call(cmd, cwd=ROOT)
            wall = time.perf_counter() - start
            if rc != 0:
                print(f"[seeds] seed {seed} exited with {rc}", file=sys.stderr)
        metrics = run_dir / "logs" / "metrics.jsonl"
        if metrics.exists():
            curve, episodes = validation_curve(metrics)
            rows.append((seed, curve, episodes, wall))
    if not rows:
        print("[seeds] no finished runs to tabulate", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
