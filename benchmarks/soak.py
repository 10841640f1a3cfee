"""Soak: the embedded default shrunk to minutes, with failing envs and a driver killed by SIGKILL, resumed each time.

Two runs of ``sokoban_tiny`` (shrunk: :func:`soak_overrides`) on ``benchmarks.faulty_env:faulty_sokoban``, whose steps
raise in ``--error-rate`` of the cases, hang past ``env_step_timeout`` in ``--hang-rate`` and never return in
``--never-rate`` (more never-returning calls than ``env_threads``: the pool must abandon them and go on; reproducibly:
the faults are a function of the trajectory and ``--fault-seed``):

1. the reference: straight through;
2. the soak: the driver is killed with SIGKILL at ``--kills`` random moments (after a random step's record
   appeared, a random fraction of a step later: during a rollout, an update or a checkpoint save) and resumed with
   ``resume_from_checkpoint=true`` each time, until it finishes.

Then :func:`compare` checks that the soak run logged every step exactly once (``metrics.jsonl``, the TensorBoard
events, the per-step trajectory dumps) with the same metrics and dumps as the reference, and that the faults were
counted (``rollout/env_failures``, ``rollout/env_timeouts``, ``rollout/env_errors/<type>``). Local mode
(``distributed=local``): the driver is the whole run, so a SIGKILL leaves nothing behind.

    python benchmarks/soak.py --out output/soak                      # 12 steps, 3 kills
    python benchmarks/soak.py --out output/soak --steps 20 --kills 5 -- actor_train.training_args.learning_rate=1e-3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "start_agentic_pipeline.py"
FAULTY_ENV = "benchmarks.faulty_env:faulty_sokoban"
VOLATILE = ("time/", "perf/")
"""Metric prefixes that measure the machine, not the run: not compared."""


def soak_overrides(
    run_dir: Path,
    steps: int,
    save_steps: int,
    fault_seed: int,
    error_rate: float,
    hang_rate: float,
    env_step_timeout: float = 1.0,
    never_rate: float = 0.0,
    env_threads: int = 2,
) -> dict[str, str]:
    """``sokoban_tiny`` shrunk to a few minutes on faulty envs, as ``{key: value}`` overrides: 16 trajectories a
        step (4 groups x 4; update batches of 8, so that a batch thinned by faults still fits), 16 validation rooms at
        the start and the end, a 20-step warm start, a checkpoint every ``save_steps`` steps, a trajectory dump every
        step. Faulty steps end their trajectory, so up to 4 refill rounds make up the batch. ``env_threads`` is small,
        so
    that never-returning calls soon outnumber the pool's threads."""
    env = "custom_envs.SimpleSokoban"
    overrides = {
        "output_dir": run_dir,
        "logging_dir": run_dir / "logs",
        "distributed": "local",
        "track_with": "tensorboard",
        "max_steps": steps,
        "save_steps": save_steps,
        "eval_steps": steps,
        "trajectory_dump_steps": 1,
        "rollout_batch_size": 16,
        "train_env_manager.env_groups": 4,
        "train_env_manager.group_size": 4,
        "val_env_manager.env_groups": 16,
        "sft_warmup.num_demos": 320,
        "sft_warmup.steps": 20,
        "actor_train.training_args.warmup_steps": 4,
        "actor_train.training_args.per_device_train_batch_size": 4,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        f"{env}.env_type": FAULTY_ENV,
        f"+{env}.env_config.error_rate": error_rate,
        f"+{env}.env_config.hang_rate": hang_rate,
        f"+{env}.env_config.hang_s": env_step_timeout + 1.0,
        f"+{env}.env_config.fault_seed": fault_seed,
        f"+{env}.env_config.never_rate": never_rate,
    }
    for manager in ("train_env_manager", "val_env_manager"):
        overrides.update(
            {
                f"{manager}.env_step_timeout": env_step_timeout,
                f"{manager}.raise_env_errors": "false",
                f"{manager}.max_refill_rounds": 4,
                f"{manager}.env_threads": env_threads,
            }
        )
    return {key: str(value) for key, value in overrides.items()}


def as_args(overrides: dict[str, str]) -> list[str]:
    """``key=value`` command-line overrides."""
    return [f"{key}={value}" for key, value in overrides.items()]


@dataclass
class Launch:
    """One start of the driver: whether it was resumed, the step after whose record it was killed, its wall time."""

    resumed: bool
    killed_after_step: int | None
    returncode: int
    wall_s: float


@dataclass
class SoakRun:
    """A run to completion through ``launches`` (more than one when killed)."""

    run_dir: Path
    launches: list[Launch] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(launch.wall_s for launch in self.launches)


def read_records(run_dir: Path) -> list[dict]:
    """The records of ``<run_dir>/logs/metrics.jsonl`` in file order (a torn last line is skipped)."""
    path = run_dir / "logs" / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


def _step_records_since(run_dir: Path, since: float) -> list[dict]:
    """Training-step records (step >= 1) written at or after ``since`` (epoch seconds)."""
    return [r for r in read_records(run_dir) if r["step"] >= 1 and r.get("timestamp", 0) >= since]


def run_with_kills(
    overrides: list[str], run_dir: Path, kill_steps: list[int], rng: random.Random, timeout_s: float = 1800
) -> SoakRun:
    """Run the pipeline to completion, killing the driver (SIGKILL) once a record of each of ``kill_steps`` (in
    increasing order) appeared plus a random fraction of a step, and resuming after each kill."""
    run, pending = SoakRun(run_dir), sorted(kill_steps)
    run_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        resumed = bool(run.launches)
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--config-name",
            "sokoban_tiny",
            *overrides,
            *(["resume_from_checkpoint=true"] if resumed else []),
        ]
        start, started_at = time.monotonic(), time.time()
        with open(run_dir / f"launch_{len(run.launches)}.log", "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            killed = _kill_when_due(proc, run_dir, pending[0] if pending else None, started_at, rng, deadline)
        run.launches.append(Launch(resumed, killed, proc.returncode, time.monotonic() - start))
        if killed is None:
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{run_dir}: launch {len(run.launches) - 1} failed with {proc.returncode}; "
                    f"see {run_dir}/launch_{len(run.launches) - 1}.log"
                )
            return run
        pending.pop(0)


def _kill_when_due(
    proc: subprocess.Popen, run_dir: Path, kill_step: int | None, started_at: float, rng: random.Random, deadline: float
) -> int | None:
    """Wait for ``proc``; once this launch logged step ``kill_step``, SIGKILL it a random fraction of a step later
    (the mean step time so far). Returns ``kill_step`` when killed, None when it ended by itself."""
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{run_dir}: the soak did not finish in time")
        records = _step_records_since(run_dir, started_at) if kill_step is not None else []
        if any(r["step"] >= kill_step for r in records):
            times = sorted(r["timestamp"] for r in records)
            step_s = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 2.0
            time.sleep(rng.uniform(0.0, step_s))
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return kill_step
        time.sleep(0.2)
    return None


def comparable(record: dict) -> dict:
    """A record without its timestamp and machine-dependent metrics."""
    return {k: v for k, v in record.items() if k != "timestamp" and not k.startswith(VOLATILE)}


def _close(a: object, b: object, rel: float = 1e-5, abs_tol: float = 1e-6) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= max(abs_tol, rel * max(abs(a), abs(b)))
    return a == b


def tensorboard_steps(log_dir: Path) -> dict[str, list[int]]:
    """Steps of every scalar tag as TensorBoard loads them (purged events dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _dump_records(path: Path) -> list[dict]:
    """A dump file's records (JSON objects, one per line)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def compare(reference: Path, soak: Path) -> dict[str, float]:
    """Figures of the soak against the reference; every check that fails is listed in ``problems`` (0 = none).

    Checked: the sequence of record steps in ``metrics.jsonl`` is the reference's (so no step lost or duplicated),
    each record's metrics equal (to 1e-5 relative; time/ and perf/ excluded), every TensorBoard scalar has each step
    once, the trajectory dumps hold the same records."""
    ref, got = read_records(reference), read_records(soak)
    problems: list[str] = []
    if [r["step"] for r in got] != [r["step"] for r in ref]:
        problems.append(f"record steps differ: {[r['step'] for r in got]} vs {[r['step'] for r in ref]}")
    compared, worst = 0, 0.0
    for a, b in zip(ref, got):
        a, b = comparable(a), comparable(b)
        if set(a) != set(b):
            problems.append(f"step {a['step']}: keys differ {sorted(set(a) ^ set(b))}")
        for key in set(a) & set(b):
            compared += 1
            if not _close(a[key], b[key]):
                problems.append(f"step {a['step']}: {key} {b[key]} != {a[key]}")
            if isinstance(a[key], float) and isinstance(b[key], float):
                worst = max(worst, abs(a[key] - b[key]))
    for tag, steps in tensorboard_steps(soak / "logs").items():
        if len(steps) != len(set(steps)):
            problems.append(
                f"tensorboard {tag}: duplicated steps {sorted(s for s in set(steps) if steps.count(s) > 1)}"
            )
    dumps_ref = sorted((reference / "logs" / "trajectories").glob("*/step_*.jsonl"))
    dumps_got = sorted((soak / "logs" / "trajectories").glob("*/step_*.jsonl"))
    names = [
        [p.relative_to(run / "logs").as_posix() for p in dumps]
        for run, dumps in ((reference, dumps_ref), (soak, dumps_got))
    ]
    if names[0] != names[1]:
        problems.append(f"trajectory dumps differ: {names[1]} vs {names[0]}")
    problems += [
        f"dump {name} differs"
        for name, a, b in zip(names[1], dumps_ref, dumps_got)
        if _dump_records(a) != _dump_records(b)
    ]
    train = [r for r in got if r["step"] >= 1]
    for problem in problems[:20]:
        print("PROBLEM:", problem)
    return {
        "steps": float(len(train)),
        "records": float(len(got)),
        "values_compared": float(compared),
        "max_abs_diff": worst,
        "problems": float(len(problems)),
        "env_failures": sum(r.get("rollout/env_failures", 0.0) for r in train),
        "env_timeouts": sum(r.get("rollout/env_timeouts", 0.0) for r in train),
        "injected_faults": sum(r.get("rollout/env_errors/InjectedFault", 0.0) for r in train),
        "val_env_failures": sum(r.get("val/env_failures", 0.0) for r in got),
        "envs_replaced": sum(r.get("rollout/envs_replaced", 0.0) for r in train),
        "trajectories": sum(r.get("rollout/batch_size", 0.0) for r in train),
        "tensorboard_tags": float(len(tensorboard_steps(soak / "logs"))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("output/soak"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--fault-seed", type=int, default=0)
    parser.add_argument("--error-rate", type=float, default=0.10)
    parser.add_argument("--hang-rate", type=float, default=0.02)
    parser.add_argument("--never-rate", type=float, default=0.02, help="steps that never return")
    parser.add_argument("--model", default=None, help="pretrain directory (default: built under --out)")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds each of the two runs may take")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for both runs (after --)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    kill_steps = sorted(rng.sample(range(1, args.steps), min(args.kills, args.steps - 1)))
    model = [f"pretrain={args.model}", "tiny_model=null"] if args.model else [f"pretrain={args.out / 'model'}"]
    runs = {}
    for name, kills in (("reference", []), ("soak", kill_steps)):
        run_dir = args.out / name
        overrides = (
            as_args(
                soak_overrides(
                    run_dir,
                    args.steps,
                    args.save_steps,
                    args.fault_seed,
                    args.error_rate,
                    args.hang_rate,
                    never_rate=args.never_rate,
                )
            )
            + model
            + list(args.overrides)
        )
        runs[name] = run_with_kills(overrides, run_dir, kills, rng, args.timeout)
        print(
            f"{name}: {len(runs[name].launches)} launch(es), {runs[name].wall_s:.0f} s, killed after steps "
            f"{[x.killed_after_step for x in runs[name].launches if x.killed_after_step is not None]}",
            flush=True,
        )
    figures = compare(args.out / "reference", args.out / "soak")
    print(json.dumps(figures, indent=1))
    return 0 if figures["problems"] == 0 else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
