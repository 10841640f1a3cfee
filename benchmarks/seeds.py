"""Does RL raise validation success on every seed? Runs one agentic config once per seed and tabulates.

Each seed gets its own RL seed, initial weights (``tiny_model.seed``), demonstration rooms (``sft_warmup.seed``)
and model directory, so the runs share nothing but the config. Runs go one after another (two at once on 2 cores
thrash). The table reads each run's ``metrics.jsonl``: validation success at every evaluation step, and the change
from step 0 (after the warm start) to the last step, with its standard error (sampled decoding, binomial).

    python benchmarks/seeds.py --seeds 1 2 3 --out output/seeds
    python benchmarks/seeds.py --seeds 1 2 3 --out output/seeds --summarize   # re-read finished runs
    python benchmarks/seeds.py --seeds 1 2 --out output/seeds_fp -- train_env_manager.format_penalty=-1.0

Wall time per run is printed too, but compare it only between runs on a quiet machine.

RLVR configs (``rlvr_tiny``) run through ``start_rlvr_pipeline.py``; their validation number is the accuracy on
the held-out problems (``val/accuracy``). ``--side-by-side N`` runs N seeds at a time, each pinned to two cores of
its own (``taskset``; a machine with 2N cores; ``--first-core`` shifts them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
    """``([(step, val success), ...], val episodes per evaluation)`` from a run's ``metrics.jsonl`` (an RLVR run's
    ``val/accuracy`` counts as its success)."""
    curve, episodes = [], 0
    for line in metrics_path.read_text().splitlines():
        row = json.loads(line)
        key = "val/success_rate" if "val/success_rate" in row else "val/accuracy"
        if key in row:
            curve.append((int(row["step"]), float(row[key])))
            episodes = int(row.get("val/batch_size", episodes))
    return curve, episodes


def start_script(config_name: str) -> Path:
    """The start script of the config's pipeline (agentic or RLVR)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from cpu_smoke import config_kind

    kind = config_kind(config_name)
    return ROOT / "examples" / f"start_{'rlvr' if kind == 'rlvr' else 'agentic'}_pipeline.py"


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
    parser.add_argument("--side-by-side", type=int, default=0, metavar="N", help="N seeds at a time, two cores each")
    parser.add_argument("--first-core", type=int, default=0, help="with --side-by-side: pin from this core on")
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    walls: dict[int, float] = {}
    if not args.summarize:
        script = start_script(args.config_name)
        todo = list(args.seeds)
        slots = list(range(max(1, min(args.side_by_side, ((os.cpu_count() or 2) - args.first_core) // 2))))
        running: list[tuple[int, subprocess.Popen, float, int]] = []
        while todo or running:
            while todo and slots:
                seed, slot = todo.pop(0), slots.pop(0)
                run_dir = (args.out / f"seed{seed}").resolve()
                cmd = [sys.executable, str(script), "--config-name", args.config_name, *seed_overrides(seed, run_dir)]
                cmd += extra
                if args.side_by_side:
                    first = args.first_core + 2 * slot
                    cmd = ["taskset", "-c", f"{first},{first + 1}", *cmd]
                print(f"[seeds] seed {seed}: {' '.join(cmd)}", flush=True)
                run_dir.mkdir(parents=True, exist_ok=True)
                log = (run_dir / "run.log").open("w") if args.side_by_side else None
                running.append(
                    (seed, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log), time.perf_counter(), slot)
                )
            time.sleep(1)
            for item in [r for r in running if r[1].poll() is not None]:
                seed, proc, began, slot = item
                running.remove(item)
                slots.append(slot)
                walls[seed] = time.perf_counter() - began
                if proc.returncode != 0:
                    print(f"[seeds] seed {seed} exited with {proc.returncode}", file=sys.stderr)
    rows = []
    for seed in args.seeds:
        metrics = (args.out / f"seed{seed}").resolve() / "logs" / "metrics.jsonl"
        if metrics.exists():
            curve, episodes = validation_curve(metrics)
            rows.append((seed, curve, episodes, walls.get(seed)))
    if not rows:
        print("[seeds] no finished runs to tabulate", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
